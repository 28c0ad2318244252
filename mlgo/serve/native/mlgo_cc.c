/* mlgo-cc / mlgo-c++, native fast path.
 *
 * A Python wrapper costs 40-70 ms of CPU per compiler invocation (interpreter start-up and
 * imports), as much as a small C file takes to compile; this program does the common case
 * with none of that. It mirrors mlgo/serve/cc.py, which stays the reference and handles every
 * uncommon case: whenever the service is not there (start it on demand), the reply is not
 * understood, or anything else unusual happens, this program execs `python -m mlgo.serve.cc`
 * with the same arguments, so messages and fallbacks live in one place. That includes all
 * it does not trust: a socket or directory not this user's alone, a peer of another uid
 * (SO_PEERCRED), a lease flag outside what mlgo.serve.lease.check_lease_flags allows, policies
 * other than MLGO_POLICY names, and an MLGO_TIMEOUT that is not a plain positive number.
 * MLGO_GUARD=size is done here too (see `guard` below) unless anything about it is unusual:
 * another MLGO_GUARD value, an object this does not read (ELF32, the other byte order), a
 * default compile that fails. Then Python does the whole compile again and says what is wrong.
 * What the guard kept is remembered (see `memo` below): a rebuild of unchanged sources compiles
 * each file once.
 * A compile at an -O level no served policy was trained for gets a reply without a lease: it
 * runs the compiler as is, after the service's note if the reply has one (the first compile
 * at that level).
 * Response files (@FILE) go to Python, which reads them as clang does, and so do inputs that
 * -x c or -x c++ may make sources without a source suffix and LTO links by another linker
 * than lld (see `for_python`), and a guarded LTO link (Python links it twice).
 * Built by `mlgo install-wrappers` (mlgo.serve.native_wrapper), which defines the venv's python,
 * the lease allow-list and the lists of clang's command line (mlgo.llvm.driver's: suffixes,
 * languages, levels, options), so no list here is a copy of one Python owns. */
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <nettle/sha2.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if !defined(MLGO_PYTHON) || !defined(MLGO_LEASE_SWITCHES) || !defined(MLGO_LEASE_CHANNELS) || \
    !defined(MLGO_LEASE_NUMBERED) || !defined(MLGO_REPORTING_LLVM_OPTIONS) ||             \
    !defined(MLGO_BUILD_ID) || !defined(MLGO_DEPARTURES_ENV) ||                           \
    !defined(MLGO_DEPARTURES_PREFIX) || !defined(MLGO_DEPARTED) || !defined(MLGO_ADVISED) || \
    !defined(MLGO_PLUGIN_FLAG) || !defined(MLGO_GUARD_SCRATCH) ||                         \
    !defined(MLGO_GUARD_CACHE) || !defined(MLGO_UNGUARDED) || !defined(MLGO_MEMO_VERSION) || \
    !defined(MLGO_MEMO_WINNERS) || !defined(MLGO_MEMO_END) || !defined(MLGO_MEMO_ENVIRONMENT) || \
    !defined(MLGO_MEMO_MAX_BYTES) || !defined(MLGO_LEASE_WAIT_MS) ||                         \
    !defined(MLGO_UNGUARDED_PREFIXES) || !defined(MLGO_SIDE_OUTPUTS) ||                      \
    !defined(MLGO_SIDE_OUTPUTS_WITH_VALUE) || !defined(MLGO_SIDE_OUTPUT_PREFIXES) ||         \
    !defined(MLGO_SOURCE_SUFFIXES) || !defined(MLGO_C_SUFFIXES) ||                           \
    !defined(MLGO_CXX_SUFFIXES) || !defined(MLGO_LANGUAGES) || !defined(MLGO_NO_CODEGEN) ||  \
    !defined(MLGO_LEVELS) || !defined(MLGO_NOT_LEVELS) || !defined(MLGO_OUTPUT_OPTIONS)
#error "build with mlgo.serve.native_wrapper: it defines MLGO_PYTHON and the lists"
#endif

#define MAX_FLAGS 64
#define LINE_MAX_BYTES 65536

/* mlgo.llvm.driver's lists, defined when this is built. */
static const char *source_suffixes[] = {MLGO_SOURCE_SUFFIXES, NULL};
static const char *c_suffixes[] = {MLGO_C_SUFFIXES, NULL};
static const char *cxx_suffixes[] = {MLGO_CXX_SUFFIXES, NULL};
static const char *languages[] = {MLGO_LANGUAGES, NULL};
static const char *no_codegen[] = {MLGO_NO_CODEGEN, NULL};
static const char *levels[] = {MLGO_LEVELS, NULL};
static const char *not_levels[] = {MLGO_NOT_LEVELS, NULL};
static const char *output_options[] = {MLGO_OUTPUT_OPTIONS, NULL};

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int one_of(const char *s, const char **list) {
  for (; *list; list++)
    if (strcmp(s, *list) == 0) return 1;
  return 0;
}

static int starts_with_one_of(const char *s, const char **prefixes) {
  for (; *prefixes; prefixes++)
    if (strncmp(s, *prefixes, strlen(*prefixes)) == 0) return 1;
  return 0;
}

/* A source file by its suffix, as mlgo.llvm.driver.is_source tells them. */
static int is_source(const char *arg) {
  if (arg[0] == '-') return 0;
  for (const char **s = source_suffixes; *s; s++)
    if (ends_with(arg, *s)) return 1;
  return 0;
}

/* Same rule as mlgo.llvm.driver.suffix_language: "c", "c++" or NULL. */
static const char *suffix_language(const char *name, int cxx) {
  const char *dot = strrchr(name, '.');
  if (!dot || dot == name) return NULL;
  if (one_of(dot, c_suffixes)) return cxx ? "c++" : "c";
  return one_of(dot, cxx_suffixes) ? "c++" : NULL;
}

/* Same rule as mlgo.llvm.driver.compile_language: the sources' language by the last -x
 * before each, else by suffix; NULL when mixed or neither C nor C++. */
static const char *source_language(int argc, char **argv, int cxx) {
  const char *x = "none", *found = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-x") == 0) {
      x = i + 1 < argc ? argv[++i] : "none";
    } else if (strncmp(a, "-x", 2) == 0 && a[2]) {
      x = a + 2;
    } else if (is_source(a)) {
      const char *language = NULL; /* -x other than C and C++: neither */
      if (strcmp(x, "none") == 0)
        language = suffix_language(a, cxx);
      else if (one_of(x, languages))
        language = x;
      if (!language || (found && strcmp(found, language) != 0)) return NULL;
      found = language;
    }
  }
  return found;
}

/* Same rule as mlgo.serve.cc.sets_llvm_options: an -mllvm X (or -mllvm=X) whose X is not one
 * of mlgo.serve.cc.REPORTING_LLVM_OPTIONS. */
static int sets_llvm_options(int argc, char **argv) {
  static const char *reporting[] = {MLGO_REPORTING_LLVM_OPTIONS, NULL};
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], "-mllvm", 6) != 0) continue;
    const char *value = "";
    if (strcmp(argv[i], "-mllvm") == 0) value = i + 1 < argc ? argv[i + 1] : "";
    else if (strncmp(argv[i], "-mllvm=", 7) == 0) value = argv[i] + 7;
    if (!starts_with_one_of(value, reporting)) return 1;
  }
  return 0;
}

/* Same rule as mlgo.serve.cc.optimizes: a source file is compiled, no flag says otherwise. */
static int optimizes(int argc, char **argv) {
  int source = 0;
  if (sets_llvm_options(argc, argv)) return 0;
  for (int i = 1; i < argc; i++) {
    if (one_of(argv[i], no_codegen)) return 0;
    source |= is_source(argv[i]);
  }
  return source;
}

/* Same rule as mlgo.llvm.driver.opt_level: the last -O flag as clang's driver reads it, NULL
 * for a level clang refuses. BUF holds an --optimize=X level. */
static const char *opt_level(int argc, char **argv, char *buf, size_t cap) {
  char numbered[4];
  const char *level = "-O0";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] == '-' && a[1] == 'X' && a[2]) /* -Xclang X, -Xlinker X: another tool's */
      i++;
    else if (strcmp(a, "--optimize") == 0)
      level = "-O";
    else if (strncmp(a, "--optimize=", 11) == 0)
      snprintf(buf, cap, "-O%s", a + 11), level = buf;
    else if (strncmp(a, "-O", 2) == 0 && !one_of(a, not_levels))
      level = a;
  }
  const char *digits = level + 2;
  if (!*digits) {
    level = "-O1";
  } else if (strspn(digits, "0123456789") == strlen(digits)) {
    while (digits[0] == '0' && digits[1]) digits++;
    snprintf(numbered, sizeof numbered, "-O%c", digits[1] || digits[0] > '3' ? '3' : digits[0]);
    level = numbered;
  }
  for (const char **l = levels; *l; l++)
    if (strcmp(level, *l) == 0) return *l;
  return NULL;
}

/* mlgo.llvm.driver.joined_output: -oFILE (not -objcmt-..., -object). */
static int joined_output(const char *arg) {
  return strncmp(arg, "-o", 2) == 0 && arg[2] && strncmp(arg, "-obj", 4) != 0;
}

/* What mlgo.serve.cc names in its messages: the first source file, or what a link writes
 * (mlgo.llvm.driver.link_output: its last -o, or a.out). */
static const char *first_source(int argc, char **argv) {
  const char *output = "a.out";
  for (int i = 1; i < argc; i++) {
    if (is_source(argv[i])) return argv[i];
    if (one_of(argv[i], output_options) && i + 1 < argc)
      output = argv[++i];
    else if (joined_output(argv[i]))
      output = argv[i] + 2;
  }
  return output;
}

/* Same rule as mlgo.llvm.driver.link_stage: "link" for a full-LTO link, "thin-link" for a ThinLTO
 * one (no -c or -S, nothing that stops code generation, no source, the last -flto switch not
 * -fno-lto), NULL for anything else. */
static const char *link_stage(int argc, char **argv) {
  const char *stage = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-c") || !strcmp(a, "-S") || one_of(a, no_codegen) || is_source(a))
      return NULL;
    if (!strcmp(a, "-flto")) stage = "link";
    else if (!strncmp(a, "-flto=", 6)) stage = strcmp(a + 6, "thin") ? "link" : "thin-link";
    else if (!strcmp(a, "-fno-lto")) stage = NULL;
  }
  return stage;
}

/* Same rule as mlgo.llvm.driver.links_with_lld: the last -fuse-ld or --ld-path names lld. */
static int links_with_lld(int argc, char **argv) {
  const char *linker = "";
  for (int i = 1; i < argc; i++) {
    if (!strncmp(argv[i], "-fuse-ld=", 9)) linker = argv[i] + 9;
    else if (!strncmp(argv[i], "--ld-path=", 10)) linker = argv[i] + 10;
  }
  const char *slash = strrchr(linker, '/'), *name = slash ? slash + 1 : linker;
  return !strcmp(linker, "lld") || !strncmp(name, "ld.lld", 6) || !strncmp(name, "lld", 3);
}

/* Invocations clang reads otherwise than the rules here, for mlgo.serve.cc: any response file
 * (@FILE), after a -x c or -x c++ an existing regular file without a source suffix (clang
 * compiles it as C or C++ unless it is an option's value, which Python tells apart), and an
 * LTO link by another linker than lld (Python says why it runs plain). A superset of what
 * mlgo.llvm.driver.typed_sources finds: no option's value is skipped here. */
static int for_python(int argc, char **argv) {
  struct stat st;
  int typed = 0;
  if (link_stage(argc, argv) && !links_with_lld(argc, argv)) return 1;
  for (int i = 1; i < argc; i++)
    if (argv[i][0] == '@') return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : "";
    if ((!strcmp(a, "-x") && one_of(next, languages)) ||
        (!strncmp(a, "-x", 2) && one_of(a + 2, languages)))
      typed = 1;
    else if (typed && a[0] != '-' && !is_source(a) && stat(a, &st) == 0 && S_ISREG(st.st_mode))
      return 1;
  }
  return 0;
}

static const char *lang;     /* "cc" or "c++" */
static const char *compiler; /* clang-22 or clang++-22, or $MLGO_CC / $MLGO_CXX */

static void exec_compiler(int argc, char **argv, char **extra, int n_extra) {
  char **args = calloc((size_t)(argc + n_extra + 1), sizeof *args);
  args[0] = (char *)compiler;
  for (int i = 1; i < argc; i++) args[i] = argv[i];
  for (int i = 0; i < n_extra; i++) args[argc + i] = extra[i];
  execvp(compiler, args);
  fprintf(stderr, "mlgo-%s: error: cannot run %s: %s\n", lang, compiler, strerror(errno));
  _exit(127);
}

/* The reference implementation takes over: same arguments, nothing consumed yet. */
static void exec_python(int argc, char **argv) {
  char **args = calloc((size_t)(argc + 4), sizeof *args);
  args[0] = MLGO_PYTHON;
  args[1] = "-m";
  args[2] = "mlgo.serve.cc";
  args[3] = (char *)lang;
  for (int i = 1; i < argc; i++) args[3 + i] = argv[i];
  execv(MLGO_PYTHON, args);
  fprintf(stderr, "mlgo-%s: error: cannot run %s: %s\n", lang, MLGO_PYTHON, strerror(errno));
  _exit(127);
}

/* Same rule as mlgo.runtime.trust.path_problem: REAL (a resolved path) is this user's (or, unless
 * OWN, root's), and every directory above it is this user's or root's; all writable by no one
 * else, unless a directory is sticky (like /tmp) and not the one OWN asks to be this user's. */
static int trusted_path(const char *real, int own) {
  char path[PATH_MAX];
  struct stat st;
  if (snprintf(path, sizeof path, "%s", real) >= (int)sizeof path || path[0] != '/') return 0;
  for (;; own = 0) {
    if (lstat(path[0] ? path : "/", &st) != 0) return 0;
    if (st.st_uid != getuid() && (own || st.st_uid != 0)) return 0;
    if ((st.st_mode & 022) && !(!own && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX))) return 0;
    if (!path[0]) return 1; /* the root checked */
    *strrchr(path, '/') = 0;
  }
}

/* Ours alone, as mlgo.serve.client.check_owned says: this user owns it, no one else may write. */
static int owned(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_uid == getuid() && !(st.st_mode & 022);
}

/* PATH's directory into DIR, as a path to it: "." for a bare name, "/" at the root. */
static void parent_dir(const char *path, char *dir, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(dir, cap, ".");
  else if (slash == path) snprintf(dir, cap, "/");
  else snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

/* The socket into OUT and its directory (the runtime directory) into DIR, both trusted. */
static int socket_path(char *out, size_t cap, char *dir, size_t dir_cap) {
  const char *explicit_path = getenv("MLGO_SOCKET");
  if (explicit_path) {
    parent_dir(explicit_path, dir, dir_cap);
    return snprintf(out, cap, "%s", explicit_path) < (int)cap && owned(dir) && owned(out);
  }
  /* The same rule as mlgo.serve.client.runtime_dir and mlgo.runtime.trust.private_dir: in a
   * directory no other user controls, resolved, this user's alone. */
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  char parent[PATH_MAX], name[32];
  struct stat st;
  if (xdg && *xdg)
    snprintf(parent, sizeof parent, "%s", xdg), snprintf(name, sizeof name, "mlgo");
  else
    snprintf(parent, sizeof parent, "/tmp"), snprintf(name, sizeof name, "mlgo-%u", getuid());
  if (!realpath(parent, dir) || !trusted_path(dir, 0) ||
      snprintf(dir + strlen(dir), dir_cap - strlen(dir), "/%s", name) >= (int)dir_cap)
    return 0;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
    return 0;
  return snprintf(out, cap, "%s/mlgo.sock", dir) < (int)cap && owned(out);
}

/* Milliseconds on the monotonic clock: the deadlines every wait below is bounded by. */
static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* What is left until DEADLINE (now_ms), as poll() takes it: 0 once it has passed. */
static int left_ms(long long deadline) {
  long long left = deadline - now_ms();
  return left <= 0 ? 0 : left >= INT_MAX ? INT_MAX : (int)left;
}

#define TIMED_OUT (-2)

/* One line from FD into BUF by DEADLINE (now_ms), the whole line: a peer that sends it a byte
 * at a time cannot stretch the wait. TIMED_OUT when the deadline passes, -1 when the peer
 * closes or fails. */
static int read_line(int fd, char *buf, size_t cap, long long deadline) {
  size_t n = 0;
  while (n + 1 < cap) {
    struct pollfd p = {fd, POLLIN, 0};
    int ready = poll(&p, 1, left_ms(deadline));
    if (ready == 0) return TIMED_OUT;
    if (ready < 0) return -1;
    ssize_t r = read(fd, buf + n, 1);
    if (r <= 0) return -1;
    if (buf[n] == '\n') break;
    n++;
  }
  buf[n] = 0;
  return (int)n;
}

/* Decodes the JSON string starting at the opening quote *p; ASCII escapes only (json.dumps
 * writes anything else as \u escapes, which we leave to the Python path). */
static char *json_string(const char **p) {
  if (**p != '"') return NULL;
  const char *s = *p + 1;
  char *out = malloc(strlen(s) + 1), *o = out;
  while (*s && *s != '"') {
    if (*s == '\\') {
      s++;
      if (*s == 'u' || !*s) return free(out), NULL;
      *o++ = *s == 'n' ? '\n' : *s == 't' ? '\t' : *s;
      s++;
    } else {
      *o++ = *s++;
    }
  }
  if (*s != '"') return free(out), NULL;
  *o = 0;
  *p = s + 1;
  return out;
}

/* The strings of the array under "KEY": [...], or -1 if absent or not understood. */
static int json_strings(const char *line, const char *key, char **out, int cap) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\": [", key);
  const char *p = strstr(line, pattern);
  if (!p) return -1;
  p += strlen(pattern);
  int n = 0;
  while (*p == '"') {
    if (n == cap || !(out[n++] = json_string(&p))) return -1;
    if (*p == ',') p += 2;
  }
  return *p == ']' ? n : -1;
}

static char *json_field(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  const char *p = strstr(line, pattern);
  if (!p) return NULL;
  p += strlen(pattern);
  return json_string(&p);
}

static int send_all(int fd, const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    s += w, n -= (size_t)w;
  }
  return 0;
}

/* MLGO_TIMEOUT in seconds, or -1 when it is not a plain positive number (Python says why). */
static double timeout_s(void) {
  const char *text = getenv("MLGO_TIMEOUT");
  if (!text) return 900.0;
  char *end;
  double value = strtod(text, &end);
  if (!*text || strspn(text, "0123456789.eE+-") != strlen(text) || *end || !isfinite(value) ||
      value <= 0)
    return -1;
  return value;
}

/* mlgo.runtime.trust.foreign_link: does the path GIVEN pass a symbolic link another user owns? */
static int foreign_link(const char *given) {
  char path[PATH_MAX];
  struct stat st;
  if (snprintf(path, sizeof path, "%s", given) >= (int)sizeof path || path[0] != '/') return 1;
  for (char *end = path + 1;; end++) { /* each component: the path up to it */
    if (*end && *end != '/') continue;
    char kept = *end;
    *end = 0;
    int gone = lstat(path, &st) != 0;
    int theirs = !gone && S_ISLNK(st.st_mode) && st.st_uid != getuid() && st.st_uid != 0;
    *end = kept;
    if (theirs) return 1;
    if (gone || !kept) return 0; /* nothing further on is a link */
  }
}

/* mlgo.runtime.files.cache_dir()/PART into OUT, resolved once (a relative MLGO_CACHE, or one
 * through another user's link, is Python's to refuse). */
static int cache_subdir(const char *part, char *out) {
  const char *root = getenv("MLGO_CACHE"), *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char given[PATH_MAX], real[PATH_MAX];
  int n;
  if (root && *root)
    n = snprintf(given, sizeof given, "%s", root);
  else if (xdg && xdg[0] == '/')
    n = snprintf(given, sizeof given, "%s/mlgo", xdg);
  else if (home && *home)
    n = snprintf(given, sizeof given, "%s/.cache/mlgo", home);
  else
    return 0;
  if (n >= (int)sizeof given || foreign_link(given) || !realpath(given, real))
    return 0;
  return snprintf(out, PATH_MAX, "%s/%s", real, part) < PATH_MAX;
}

/* Where the lease's plugins must come from: the cache's plugin/. */
static int plugin_cache(char *out) { return cache_subdir("plugin", out); }

/* The plugin FLAG names (mlgo.serve.lease.PLUGIN_FLAG, defined when this is built), or NULL
 * when it is not one. */
static const char *plugin_of(const char *flag) {
  size_t len = sizeof MLGO_PLUGIN_FLAG - 1;
  return strncmp(flag, MLGO_PLUGIN_FLAG, len) == 0 ? flag + len : NULL;
}

/* "NAME=" followed by digits alone, for one of NAMES. */
static int numbered(const char *flag, const char **names) {
  for (const char **s = names; *s; s++) {
    size_t len = strlen(*s);
    if (strncmp(flag, *s, len) != 0 || !flag[len]) continue;
    const char *c = flag + len;
    while (*c >= '0' && *c <= '9') c++;
    if (!*c) return 1;
  }
  return 0;
}

/* Same rule as mlgo.serve.lease.check_lease_flags: the switches of the problems' serving flags, a
 * base switch with a number, a channel option on a FIFO base directly in RUNTIME/channels (the
 * lists are mlgo.serve.lease.lease_allow_list, defined when this is built), or a trusted plugin
 * inside the cache of built plugins, which the compiler then gets by the resolved path that
 * was checked (a link on the way could point elsewhere a moment later). */
static int lease_flags_ok(char **flags, int n, const char *runtime) {
  static const char *switches[] = {MLGO_LEASE_SWITCHES, NULL};
  static const char *channels[] = {MLGO_LEASE_CHANNELS, NULL};
  static const char *bases[] = {MLGO_LEASE_NUMBERED, NULL};
  char want[PATH_MAX], dir[PATH_MAX], got[PATH_MAX], plugins[PATH_MAX];
  if (snprintf(dir, sizeof dir, "%s/channels", runtime) >= (int)sizeof dir || !realpath(dir, want))
    return 0;
  for (int i = 0; i < n; i++) {
    const char *plugin = plugin_of(flags[i]);
    if (plugin) {
      size_t len;
      if (!plugin_cache(plugins) || !realpath(plugin, got)) return 0;
      len = strlen(plugins);
      if (strncmp(got, plugins, len) != 0 || got[len] != '/' || !trusted_path(got, 1)) return 0;
      char *checked = malloc(sizeof MLGO_PLUGIN_FLAG + strlen(got));
      sprintf(checked, "%s%s", MLGO_PLUGIN_FLAG, got);
      flags[i] = checked;
      continue;
    }
    if (strcmp(flags[i], "-mllvm") != 0 || ++i == n) return 0;
    int ok = 0;
    for (const char **s = switches; *s; s++) ok |= strcmp(flags[i], *s) == 0;
    ok = ok || numbered(flags[i], bases);
    for (const char **c = channels; *c && !ok; c++) {
      size_t len = strlen(*c);
      if (strncmp(flags[i], *c, len) != 0) continue;
      const char *base = flags[i] + len, *slash = strrchr(base, '/');
      if (!slash || !slash[1] || !strcmp(slash + 1, ".") || !strcmp(slash + 1, "..")) return 0;
      snprintf(dir, sizeof dir, "%.*s", (int)(slash - base), base);
      ok = slash > base && realpath(dir, got) && strcmp(got, want) == 0;
    }
    if (!ok) return 0;
  }
  return 1;
}

/* mlgo.serve.lease.at_link: a link lease's flags (checked) as clang hands them to lld, each
 * plugin as -Xlinker --load-pass-plugin=PATH, in place in FLAGS (room for MAX_FLAGS); 0 when
 * one is not a plugin (Python says why). */
static int at_link(char **flags, int *n) {
  if (2 * *n > MAX_FLAGS) return 0;
  for (int i = *n - 1; i >= 0; i--) {
    const char *plugin = plugin_of(flags[i]);
    if (!plugin) return 0;
    char *load = malloc(strlen(plugin) + sizeof "--load-pass-plugin=");
    sprintf(load, "--load-pass-plugin=%s", plugin);
    flags[2 * i] = "-Xlinker";
    flags[2 * i + 1] = load;
  }
  *n *= 2;
  return 1;
}

/* Does the service serve exactly the policies MLGO_POLICY names (resolved), if it names
 * any? A mismatch is Python's to report. */
static int policies_match(const char *line) {
  const char *wanted = getenv("MLGO_POLICY");
  if (!wanted || !*wanted) return 1;
  char *served[MAX_FLAGS], *copy = strdup(wanted), *save = NULL, resolved[PATH_MAX];
  int n_served = json_strings(line, "policies", served, MAX_FLAGS), n_wanted = 0;
  if (n_served < 0) return 0;
  for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save), n_wanted++) {
    int found = 0;
    if (!realpath(p, resolved)) return 0;
    for (int i = 0; i < n_served; i++) found |= strcmp(served[i], resolved) == 0;
    if (!found) return 0;
  }
  return n_wanted == n_served;
}

/* MLGO_GUARD=size, as mlgo.serve.guard does it and by the rules of mlgo.llvm.cmdline (which
 * tests/test_guard.py holds this to on a table of command lines): while the policy's compile
 * runs, the same file is compiled with the default heuristic into a scratch directory in the
 * private runtime directory, writing nothing else; when both succeed, the object with fewer
 * executable bytes stays (a tie keeps the default's), put in place through one descriptor of
 * the object's directory (`put_in_place`). */
/* mlgo.serve.guard.UNGUARDED and UNGUARDED_PREFIXES, and mlgo.llvm.cmdline.SIDE_OUTPUTS,
 * SIDE_OUTPUTS_WITH_VALUE and SIDE_OUTPUT_PREFIXES, defined when this is built. */
static const char *unguarded[] = {MLGO_UNGUARDED, NULL};
static const char *unguarded_prefixes[] = {MLGO_UNGUARDED_PREFIXES, NULL};
static const char *side_outputs[] = {MLGO_SIDE_OUTPUTS, NULL};
static const char *side_outputs_with_value[] = {MLGO_SIDE_OUTPUTS_WITH_VALUE, NULL};
static const char *side_output_prefixes[] = {MLGO_SIDE_OUTPUT_PREFIXES, NULL};

static struct {
  pid_t pid;          /* the default compile while it runs, else 0 */
  char dir[PATH_MAX]; /* the scratch directory, "" when there is none */
  char obj[PATH_MAX]; /* the object the command line writes */
  char out[PATH_MAX]; /* the default compile's, in DIR */
  char deps[PATH_MAX]; /* its dependency list, in DIR, when the outcome is to be remembered */
} guard;

/* -Wp,-MD,FILE and the like: dependency options handed to the preprocessor. */
static int preprocessor_dependencies(const char *arg) {
  if (strncmp(arg, "-Wp,", 4) != 0) return 0;
  for (const char *comma = arg + 3; comma; comma = strchr(comma + 1, ','))
    if (comma[1] == '-' && comma[2] == 'M') return 1;
  return 0;
}

/* mlgo.serve.guard.guarded_object: the object this compile writes into OBJ, if the guard can
 * compare it (one source, -c, an ELF object, no output that names its own path). */
static int guarded_object(int argc, char **argv, char *obj, size_t cap) {
  int compiles = 0, sources = 0, lto = 0;
  const char *source = NULL, *output = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (one_of(a, unguarded) || starts_with_one_of(a, unguarded_prefixes)) return 0;
    compiles |= strcmp(a, "-c") == 0;
    if (is_source(a)) sources++, source = a;
    if (strcmp(a, "-flto") == 0 || strncmp(a, "-flto=", 6) == 0) lto = 1;
    else if (strcmp(a, "-fno-lto") == 0) lto = 0;
  }
  if (!compiles || sources != 1 || lto) return 0;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "-o") == 0) output = ++i < argc ? argv[i] : NULL;
    else if (joined_output(argv[i])) output = argv[i] + 2;
  if (output && strcmp(output, "-") == 0) return 0;
  if (output && *output) {
    size_t n = strlen(output);
    while (n > 1 && output[n - 1] == '/') n--; /* as pathlib reads "dir/x.o/" */
    return snprintf(obj, cap, "%.*s", (int)n, output) < (int)cap;
  }
  const char *name = strrchr(source, '/') ? strrchr(source, '/') + 1 : source;
  const char *dot = strrchr(name, '.'); /* pathlib's stem: a leading dot is no suffix */
  int stem = dot && dot > name ? (int)(dot - name) : (int)strlen(name);
  return snprintf(obj, cap, "%.*s.o", stem, name) < (int)cap;
}

/* mlgo.serve.guard.default_args: the command line compiling to OUT and writing nothing else
 * (mlgo.llvm.cmdline.without_outputs), the compiler first, NULL-terminated; with DEPS, it
 * also writes the dependency list there, for the guard's memory. */
static char **default_args(int argc, char **argv, const char *out, const char *deps) {
  char **args = calloc((size_t)argc + 6, sizeof *args);
  int n = 0;
  args[n++] = (char *)compiler;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-o") == 0 || one_of(a, side_outputs_with_value))
      i++;
    else if (!(one_of(a, side_outputs) || joined_output(a) ||
               starts_with_one_of(a, side_output_prefixes) || preprocessor_dependencies(a)))
      args[n++] = argv[i];
  }
  args[n++] = "-o";
  args[n++] = (char *)out;
  if (deps) args[n++] = "-MD", args[n++] = "-MF", args[n++] = (char *)deps;
  return args;
}

/* The guard's memory (mlgo.serve.memo, whose directory and entry format are defined when
 * this is built): a guarded compile whose policy departed from clang remembers which object it
 * kept, the policy's or the default's, so that a rebuild of unchanged sources compiles the file
 * once, with that one, and gets the same object. An entry is named by what decides the object
 * besides the files read (the command line without its outputs, the directory it runs in, the
 * compiler, the lease's flags, whose plugin's path is a hash of the policy and LLVM's version,
 * and the environment clang finds headers by) and lists the hash of every file the compile read
 * (its dependency list, as ccache's direct mode does): a hit needs them all unchanged. Anything
 * else is a miss, and the file is guarded again: an entry that is stale, corrupt, too large,
 * not this user's or writable by another. A wrong winner could cost bytes, never a wrong
 * object: either way the object is a real compile of the sources as they are. */
#define MEMO_VERSION MLGO_MEMO_VERSION
#define MEMO_END MLGO_MEMO_END
#define MEMO_MAX_BYTES MLGO_MEMO_MAX_BYTES
#define HEX_DIGEST (2 * SHA256_DIGEST_SIZE)
enum { MEMO_MISS, MEMO_POLICY, MEMO_DEFAULT };
static const char *memo_winners[] = {"", MLGO_MEMO_WINNERS};
static const char *memo_env[] = {MLGO_MEMO_ENVIRONMENT, NULL};
static char memo[PATH_MAX]; /* this compile's entry, "" when it is not remembered */
static struct timespec memo_since; /* when it was named: a file changed since is not remembered */

static int before(struct timespec a, struct timespec b) {
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

static struct timespec later(struct timespec a, struct timespec b) { return before(a, b) ? b : a; }

/* S with its NUL, so that ("ab", "c") and ("a", "bc") differ. */
static void hash_string(struct sha256_ctx *ctx, const char *s) {
  sha256_update(ctx, strlen(s) + 1, (const uint8_t *)s);
}

static void hex_digest(struct sha256_ctx *ctx, char out[HEX_DIGEST + 1]) {
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(ctx, sizeof digest, digest);
  for (int i = 0; i < SHA256_DIGEST_SIZE; i++) sprintf(out + 2 * i, "%02x", digest[i]);
}

/* The hex SHA-256 of the regular file at PATH into OUT, and into CHANGED (if not NULL) the
 * later of its modification and status change times; 0 on success. */
static int hash_file(const char *path, char out[HEX_DIGEST + 1], struct timespec *changed) {
  static uint8_t buf[65536];
  struct sha256_ctx ctx;
  struct stat st;
  ssize_t n = -1;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  sha256_init(&ctx);
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    while ((n = read(fd, buf, sizeof buf)) > 0) sha256_update(&ctx, (size_t)n, buf);
  }
  close(fd);
  if (n < 0) return -1;
  hex_digest(&ctx, out);
  if (changed) *changed = later(st.st_mtim, st.st_ctim);
  return 0;
}

/* The compiler execvp runs, as its resolved path, size and modification time (another clang,
 * or this one upgraded, is another key) into OUT; 0 when it is not found. */
static int compiler_identity(char *out, size_t cap) {
  char candidate[PATH_MAX], real[PATH_MAX];
  struct stat st;
  const char *dirs = strchr(compiler, '/') ? NULL : getenv("PATH");
  if (!dirs && !strchr(compiler, '/')) return 0;
  for (const char *d = dirs;;) {
    size_t len = dirs ? strcspn(d, ":") : 0;
    if (dirs)
      snprintf(candidate, sizeof candidate, "%.*s/%s", (int)(len ? len : 1), len ? d : ".",
               compiler);
    else
      snprintf(candidate, sizeof candidate, "%s", compiler);
    if (access(candidate, X_OK) == 0 && realpath(candidate, real) && stat(real, &st) == 0)
      return snprintf(out, cap, "%s %lld %lld.%09ld", real, (long long)st.st_size,
                      (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec) < (int)cap;
    if (!dirs || !d[len]) return 0;
    d += len + 1;
  }
}

/* Names this compile's entry in MEMO: in the cache's guard directory (made 0700), if it is
 * this user's alone (mlgo.runtime.trust). 0 when it cannot be remembered. */
static int memo_name(int argc, char **argv, char **flags, int n_flags) {
  char dir[PATH_MAX], cwd[PATH_MAX], identity[PATH_MAX + 64], key[HEX_DIGEST + 1];
  struct sha256_ctx ctx;
  struct stat st;
  if (!cache_subdir(MLGO_GUARD_CACHE, dir) || !getcwd(cwd, sizeof cwd) ||
      !compiler_identity(identity, sizeof identity))
    return 0;
  if ((mkdir(dir, 0700) != 0 && errno != EEXIST) || lstat(dir, &st) != 0 ||
      !S_ISDIR(st.st_mode) || !trusted_path(dir, 1))
    return 0;
  clock_gettime(CLOCK_REALTIME, &memo_since);
  sha256_init(&ctx);
  hash_string(&ctx, MEMO_VERSION);
  hash_string(&ctx, identity);
  hash_string(&ctx, cwd);
  char **args = default_args(argc, argv, "", NULL);
  for (char **a = args + 1; *a; a++) hash_string(&ctx, *a);
  free(args);
  for (const char **name = memo_env; *name; name++) {
    const char *value = getenv(*name);
    hash_string(&ctx, *name);
    hash_string(&ctx, value ? "set" : "unset");
    if (value) hash_string(&ctx, value);
  }
  for (int i = 0; i < n_flags; i++) hash_string(&ctx, flags[i]);
  hex_digest(&ctx, key);
  return snprintf(memo, sizeof memo, "%s/%s", dir, key) < (int)sizeof memo;
}

/* The winner the entry TEXT names, if it is whole (its version first, its end last) and every
 * file it lists still hashes as it did; MEMO_MISS otherwise. */
static int memo_check(char *text) {
  char digest[HEX_DIGEST + 1], *save = NULL, *line = strtok_r(text, "\n", &save);
  int winner = MEMO_MISS, files = 0;
  if (!line || strcmp(line, MEMO_VERSION) != 0 || !(line = strtok_r(NULL, "\n", &save)))
    return MEMO_MISS;
  for (int w = MEMO_POLICY; w <= MEMO_DEFAULT; w++)
    if (strcmp(line, memo_winners[w]) == 0) winner = w;
  while (winner != MEMO_MISS && (line = strtok_r(NULL, "\n", &save))) {
    if (strcmp(line, MEMO_END) == 0) return files && !strtok_r(NULL, "\n", &save) ? winner : MEMO_MISS;
    if (strlen(line) <= HEX_DIGEST + 1 || line[HEX_DIGEST] != ' ' ||
        hash_file(line + HEX_DIGEST + 1, digest, NULL) != 0 || strncmp(line, digest, HEX_DIGEST) != 0)
      return MEMO_MISS;
    files++;
  }
  return MEMO_MISS;
}

/* The winner MEMO remembers, read only from a regular file of this user's that no one else
 * may write, at most MEMO_MAX_BYTES; MEMO_MISS otherwise. */
static int memo_lookup(void) {
  struct stat st;
  char *text = NULL;
  int winner = MEMO_MISS, fd = open(memo, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return MEMO_MISS;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid() &&
      !(st.st_mode & 022) && st.st_size <= MEMO_MAX_BYTES &&
      (text = malloc((size_t)st.st_size + 1)) &&
      pread(fd, text, (size_t)st.st_size, 0) == st.st_size) {
    text[st.st_size] = 0;
    winner = memo_check(text);
  }
  free(text);
  close(fd);
  return winner;
}

/* Appends "HASH NAME" for the file NAME to the entry ENTRY (LEN bytes so far); 0 on success,
 * -1 if it cannot be hashed or changed after the compile began (an edit during the build: the
 * compile may have read it before, as ccache's direct mode says of a file "too new"). */
static int memo_add_file(char *entry, size_t *len, const char *name) {
  char digest[HEX_DIGEST + 1];
  struct timespec changed;
  if (hash_file(name, digest, &changed) != 0 || !before(changed, memo_since)) return -1;
  int n = snprintf(entry + *len, MEMO_MAX_BYTES - *len, "%s %s\n", digest, name);
  if (n < 0 || (size_t)n >= MEMO_MAX_BYTES - *len) return -1;
  *len += (size_t)n;
  return 0;
}

/* Remembers WINNER in MEMO with the hash of each file the dependency list DEPS names (make's
 * rule as clang writes it: escaped spaces, continued lines), read only if it is a regular
 * file, not a link, that this compile wrote (changed since MEMO_SINCE). Written beside the
 * entry and renamed over it: never half of one. Nothing is remembered if a file cannot be
 * hashed. */
static void memo_store(int winner, const char *deps) {
  static char rule[MEMO_MAX_BYTES], entry[MEMO_MAX_BYTES];
  char name[PATH_MAX], tmp[PATH_MAX];
  size_t len = 0, n = 0;
  struct stat st;
  int fd = open(deps, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), ok = 1;
  ssize_t got = fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
                        before(st.st_mtim, memo_since)
                    ? -1
                    : read(fd, rule, sizeof rule - 1);
  if (fd >= 0) close(fd);
  if (got <= 0 || got == (ssize_t)sizeof rule - 1) return;
  rule[got] = 0;
  const char *p = strstr(rule, ": ");
  if (!p) return;
  len = (size_t)snprintf(entry, sizeof entry, "%s\n%s\n", MEMO_VERSION, memo_winners[winner]);
  for (p++; ok; p++) {
    char c = *p;
    int escaped = 0;
    if (c == '\\' && p[1] == '\n') /* a continued line */
      c = ' ', p++;
    else if ((c == '\\' && (p[1] == ' ' || p[1] == '#')) || (c == '$' && p[1] == '$'))
      c = *++p, escaped = 1; /* a character of a name */
    if (!escaped && (c == ' ' || c == '\t' || c == '\n' || !c)) {
      name[n] = 0;
      ok = !n || memo_add_file(entry, &len, name) == 0;
      n = 0;
      if (c == '\n' || !c) break;
    } else if (n + 1 < sizeof name) {
      name[n++] = c;
    } else {
      ok = 0;
    }
  }
  int end = snprintf(entry + len, sizeof entry - len, "%s\n", MEMO_END);
  if (!ok || end < 0 || (size_t)end >= sizeof entry - len) return;
  len += (size_t)end;
  if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", memo) >= (int)sizeof tmp || (fd = mkstemp(tmp)) < 0)
    return;
  ok = write(fd, entry, len) == (ssize_t)len;
  if (close(fd) != 0 || !ok || rename(tmp, memo) != 0) unlink(tmp);
}

/* The dependency list this compile writes itself, with every file it reads (-MD, not -MMD,
 * which leaves out system headers, and -MF FILE): where the plugin made clang's own object,
 * no guard's compile writes one, and this is what the memory lists. NULL if there is none. */
static const char *own_dependencies(int argc, char **argv) {
  const char *file = NULL;
  int all = 0;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "-MD") == 0)
      all = 1;
    else if (strcmp(argv[i], "-MF") == 0)
      file = i + 1 < argc ? argv[++i] : NULL;
    else if (strncmp(argv[i], "-MF", 3) == 0)
      file = argv[i] + 3;
  return all && file && *file ? file : NULL;
}

/* Whether ARGV asks for no dependency output of its own (no -M option, none through -Wp,):
 * a compile the wrapper may then give one in its scratch, for the guard's memory. */
static int writes_no_dependencies(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strncmp(argv[i], "-M", 2) == 0 || preprocessor_dependencies(argv[i])) return 0;
  return 1;
}

/* mlgo.llvm.sizes.text_size of the ELF64 object at PATH: the sizes of its sections flagged
 * both SHF_ALLOC and SHF_EXECINSTR. -1 for anything else (ELF32, the other byte order, not
 * ELF, unreadable): Python's reader takes those. */
static long long text_size(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const unsigned char native = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB
                                                                         : ELFDATA2MSB;
  const uint64_t want = SHF_ALLOC | SHF_EXECINSTR;
  Elf64_Ehdr eh;
  Elf64_Shdr sh;
  long long total = -1;
  if (pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh &&
      memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
      eh.e_ident[EI_DATA] == native && (eh.e_shoff == 0 || eh.e_shentsize == sizeof sh)) {
    uint64_t count = eh.e_shnum;
    total = 0;
    /* Past SHN_LORESERVE sections (-ffunction-sections), the count is section 0's size. */
    if (count == 0 && eh.e_shoff)
      count = pread(fd, &sh, sizeof sh, (off_t)eh.e_shoff) == (ssize_t)sizeof sh ? sh.sh_size : 0;
    for (uint64_t i = 0; i < count && total >= 0; i++)
      if (pread(fd, &sh, sizeof sh, (off_t)(eh.e_shoff + i * sizeof sh)) != (ssize_t)sizeof sh)
        total = -1;
      else if ((sh.sh_flags & want) == want)
        total += (long long)sh.sh_size;
  }
  close(fd);
  return total;
}

/* Ends the default compile if it still runs, and removes the scratch directory with whatever is
 * in it (the default's object, a temporary file of clang's): in a directory only this user may
 * write, so no one can swap it for a link meanwhile. */
static void guard_stop(void) {
  if (guard.pid > 0) {
    kill(guard.pid, SIGKILL);
    waitpid(guard.pid, NULL, 0);
    guard.pid = 0;
  }
  if (!guard.dir[0]) return;
  DIR *dir = opendir(guard.dir);
  for (struct dirent *e; dir && (e = readdir(dir));)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
      unlinkat(dirfd(dir), e->d_name, 0);
  if (dir) closedir(dir);
  rmdir(guard.dir);
  guard.dir[0] = guard.out[0] = 0;
}

/* A build stopped by a signal (make's Ctrl-C, a job killed) leaves no scratch directory:
 * the default compile gets the same signal (clang removes its temporary files on it). */
static void guard_on_signal(int sig) {
  if (guard.pid > 0) {
    kill(guard.pid, sig);
    waitpid(guard.pid, NULL, 0);
  }
  unlink(guard.out);
  rmdir(guard.dir);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* The scratch directory and the default compile in it, the child's signal mask BEFORE. As
 * mlgo.serve.guard.scratch_dir: in RUNTIME (resolved) if no other user could change it. */
static int guard_spawn(int argc, char **argv, const char *runtime, const sigset_t *before) {
  char real[PATH_MAX];
  const char *name = strrchr(guard.obj, '/') ? strrchr(guard.obj, '/') + 1 : guard.obj;
  if (!realpath(runtime, real) || !trusted_path(real, 1) ||
      snprintf(guard.dir, sizeof guard.dir, "%s/%sXXXXXX", real, MLGO_GUARD_SCRATCH) >=
          (int)sizeof guard.dir ||
      !mkdtemp(guard.dir)) {
    guard.dir[0] = 0;
    return -1;
  }
  if (snprintf(guard.out, sizeof guard.out, "%s/%s", guard.dir, name) >= (int)sizeof guard.out ||
      snprintf(guard.deps, sizeof guard.deps, "%s.d", guard.out) >= (int)sizeof guard.deps)
    return guard_stop(), -1;
  char **args = default_args(argc, argv, guard.out, memo[0] ? guard.deps : NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0), dup2(null, 1), dup2(null, 2);
    sigprocmask(SIG_SETMASK, before, NULL);
    execvp(compiler, args);
    _exit(127);
  }
  free(args);
  if (pid < 0) return guard_stop(), -1;
  guard.pid = pid;
  return 1;
}

/* Starts the default compile beside the policy's, if the guard can compare this one, with its
 * scratch directory in RUNTIME. 0: it cannot (the policy's output stays as it is), 1: started,
 * -1: failed to start. */
static int guard_start(int argc, char **argv, const char *runtime) {
  struct stat st;
  if (!guarded_object(argc, argv, guard.obj, sizeof guard.obj)) return 0;
  if (stat(guard.obj, &st) == 0 && !S_ISREG(st.st_mode)) return 0; /* -o /dev/null */
  struct sigaction on_signal = {.sa_handler = guard_on_signal, .sa_flags = SA_RESTART};
  sigset_t stopping, before;
  sigemptyset(&stopping);
  for (const int *sig = (const int[]){SIGHUP, SIGINT, SIGTERM, 0}; *sig; sig++)
    sigaddset(&stopping, *sig), sigaction(*sig, &on_signal, NULL);
  /* Held off until the directory and the compile in it are where the handler looks. */
  sigprocmask(SIG_BLOCK, &stopping, &before);
  int started = guard_spawn(argc, argv, runtime, &before);
  sigprocmask(SIG_SETMASK, &before, NULL);
  return started;
}

/* mlgo.serve.guard.put_in_place: KEPT (in the scratch directory) becomes OBJ, through one
 * descriptor of OBJ's directory, so that a directory swapped for a link meanwhile cannot send
 * it elsewhere: renamed, or across file systems copied into a new file beside OBJ (O_EXCL: never
 * one someone put there) that is renamed over it. 0 on success. */
static int put_in_place(const char *kept, const char *obj) {
  char parent[PATH_MAX], tmp[NAME_MAX + 1];
  const char *name = strrchr(obj, '/') ? strrchr(obj, '/') + 1 : obj;
  parent_dir(obj, parent, sizeof parent);
  int dir = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -1, out = -1, in;
  if (dir < 0) return -1;
  if (renameat(AT_FDCWD, kept, dir, name) == 0) return close(dir), 0;
  if (errno != EXDEV) return close(dir), -1;
  struct stat st;
  if ((in = open(kept, O_RDONLY | O_CLOEXEC)) < 0 || fstat(in, &st) != 0) goto done;
  for (unsigned n = (unsigned)getpid(); out < 0; n = n * 1103515245u + 12345u) {
    if (snprintf(tmp, sizeof tmp, ".%.200s.%08x", name, n) >= (int)sizeof tmp) goto done;
    out = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, st.st_mode & 0777);
    if (out < 0 && errno != EEXIST) goto done;
  }
  char buf[65536];
  ssize_t r;
  while ((r = read(in, buf, sizeof buf)) > 0 && write(out, buf, (size_t)r) == r) continue;
  int copied = close(out) == 0 && r == 0;
  out = -1;
  rc = copied && renameat(dir, tmp, dir, name) == 0 ? 0 : -1;
  if (rc) unlinkat(dir, tmp, 0);
done:
  if (in >= 0) close(in);
  if (out >= 0) close(out), unlinkat(dir, tmp, 0);
  close(dir);
  return rc;
}

/* After both compiles succeeded: keeps the smaller object. -1 when the default compile failed
 * or an object is not one this reads (Python does it again and says why). */
static int guard_keep_smaller(void) {
  int status;
  pid_t pid = guard.pid;
  guard.pid = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return -1;
  long long policy = text_size(guard.obj), fallback = text_size(guard.out);
  if (policy < 0 || fallback < 0) return -1;
  if (fallback <= policy && put_in_place(guard.out, guard.obj) != 0) return -1;
  if (memo[0]) memo_store(fallback <= policy ? MEMO_DEFAULT : MEMO_POLICY, guard.deps);
  return 0;
}

/* mlgo.llvm.cmdline.made_default_object: did the plugin's compile, which wrote its marks in
 * FD, decide as clang would (so the guard's compile would make the same object)? */
static int made_default_object(int fd) {
  char marks[64];
  ssize_t n = pread(fd, marks, sizeof marks - 1, 0);
  marks[n > 0 ? n : 0] = 0;
  return strchr(marks, MLGO_ADVISED[0]) && !strchr(marks, MLGO_DEPARTED[0]);
}

/* The compile's stderr, kept in FD, on ours. */
static void copy_to_stderr(int fd) {
  char buf[65536];
  ssize_t n;
  lseek(fd, 0, SEEK_SET);
  while ((n = read(fd, buf, sizeof buf)) > 0)
    if (write(2, buf, (size_t)n) != n) break;
}

/* mlgo.serve.cc.error_line, nearly: the first line of the output in FD that names an error
 * ("error:", "Error 2"), else its last line. */
static void error_line(int fd, char *out, size_t cap) {
  static char buf[65536];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  buf[n > 0 ? n : 0] = 0;
  char *last = NULL, *save = NULL;
  snprintf(out, cap, "(no output)");
  for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    while (*line == ' ' || *line == '\t') line++;
    if (!*line) continue;
    last = line;
    if (strcasestr(line, "error:") || strcasestr(line, "error ")) break;
  }
  if (last) snprintf(out, cap, "%.300s", last);
}

/* mlgo.serve.cc._compile_plain_after: the compile with the policy failed; compile as plain
 * clang does. If that fails too the error is the user's, shown as clang says it; if it passes,
 * the policy's flags broke the compile: one warning, and the object is plain clang's. */
static int compile_plain_after(int rc, int err_fd, int argc, char **argv, const char *source,
                               int link) {
  pid_t pid = fork();
  if (pid == 0) exec_compiler(argc, argv, NULL, 0);
  int status;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return rc;
  int plain = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (plain == 0) {
    char why[320];
    error_line(err_fd, why, sizeof why);
    fprintf(stderr,
            "mlgo-cc: warning: the %s with the policy failed (exit %d: %s); %s %s "
            "with the default heuristic\n",
            link ? "link" : "compile", rc, why, link ? "linked" : "compiled", source);
  }
  return plain;
}

/* The compile cannot have the policy (PROBLEM says why): under MLGO_STRICT an error, else one
 * warning and clang's own heuristic, worded as mlgo.serve.cc words it. */
static int fall_back(int argc, char **argv, const char *problem, int link) {
  const char *source = first_source(argc, argv);
  if (getenv("MLGO_STRICT")) {
    fprintf(stderr, "mlgo-cc: error: %s (%s)\n", problem, source);
    return 1;
  }
  fprintf(stderr, "mlgo-cc: warning: %s; %s %s with the default heuristic\n", problem,
          link ? "linking" : "compiling", source);
  exec_compiler(argc, argv, NULL, 0);
  return 127;
}

/* Where the wrapper's temporary files go: $TMPDIR when it is a directory of this user's that no
 * one else may write (a full /tmp must not cost the policy), else /tmp, as before. */
static const char *temp_dir(void) {
  const char *dir = getenv("TMPDIR");
  struct stat st;
  if (dir && dir[0] == '/' && strlen(dir) < PATH_MAX - 64 && stat(dir, &st) == 0 &&
      S_ISDIR(st.st_mode) && st.st_uid == getuid() && !(st.st_mode & 022) &&
      access(dir, W_OK | X_OK) == 0)
    return dir;
  return "/tmp";
}

#ifdef MLGO_GUARD_CHECK
/* Built by tests/test_guard.py to hold the rules above against Python's: `lease RUNTIME
 * FLAGS...` prints whether a lease may carry FLAGS (1 or 0); `guard ARGS...`
 * prints the object the guard compares (nothing if none) and the default compile's arguments
 * after the compiler (to OUT), each ended by a NUL; `text FILE...` prints each file's
 * text_size on a line; `language cc|c++ ARGS...` the sources' language (or none);
 * `python ARGS...` whether the wrapper hands ARGS to Python before reading them (1 or 0);
 * `link ARGS...` a link's stage (or none), whether lld links it (1 or 0), and its output;
 * `optimizes ARGS...` whether a policy may serve the compile (1 or 0); `read ARGS...` all this
 * wrapper reads of ARGS, a line each (tests/test_driver.py): the sources' positions, the level,
 * the language for mlgo-cc and for mlgo-c++, optimizes, the link's stage, lld, what messages
 * name, and whether Python reads ARGS instead. */
static int check(int argc, char **argv) {
  char obj[PATH_MAX];
  if (argc > 1 && strcmp(argv[1], "read") == 0) {
    int n = argc - 1; /* ARGS after the subcommand, which stands for the program's name */
    char **args = argv + 1, buf[64];
    printf("sources");
    for (int i = 1; i < n; i++)
      if (is_source(args[i])) printf(" %d", i - 1);
    const char *level = opt_level(n, args, buf, sizeof buf), *stage = link_stage(n, args);
    const char *c = source_language(n, args, 0), *cxx = source_language(n, args, 1);
    printf("\n%s\n%s\n%s\n%d\n%s\n%d\n%s\n%d\n", level ? level : "none", c ? c : "none",
           cxx ? cxx : "none", optimizes(n, args), stage ? stage : "none", links_with_lld(n, args),
           first_source(n, args), for_python(n, args));
    return 0;
  }
  if (argc > 2 && strcmp(argv[1], "lease") == 0) {
    printf("%d\n", lease_flags_ok(argv + 3, argc - 3, argv[2]));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "python") == 0) {
    printf("%d\n", for_python(argc - 1, argv + 1));
    return 0;
  }
  if (argc > 2 && strcmp(argv[1], "language") == 0) {
    const char *language = source_language(argc - 2, argv + 2, strcmp(argv[2], "c++") == 0);
    printf("%s\n", language ? language : "none");
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "link") == 0) {
    const char *stage = link_stage(argc - 1, argv + 1);
    printf("%s %d %s\n", stage ? stage : "none", links_with_lld(argc - 1, argv + 1),
           first_source(argc - 1, argv + 1));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "optimizes") == 0) {
    printf("%d\n", optimizes(argc - 1, argv + 1));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "text") == 0) {
    for (int i = 2; i < argc; i++) printf("%lld\n", text_size(argv[i]));
    return 0;
  }
  if (!guarded_object(argc - 1, argv + 1, obj, sizeof obj)) return 0;
  printf("%s%c", obj, 0);
  for (char **a = default_args(argc - 1, argv + 1, "OUT", NULL) + 1; *a; a++)
    printf("%s%c", *a, 0);
  return 0;
}
#endif

int main(int argc, char **argv) {
#ifdef MLGO_GUARD_CHECK
  return check(argc, argv);
#endif
  int cxx = ends_with(argv[0], "++");
  lang = cxx ? "c++" : "cc";
  compiler = getenv(cxx ? "MLGO_CXX" : "MLGO_CC");
  if (!compiler) compiler = cxx ? "clang++-22" : "clang-22";
  if (getenv("MLGO_DISABLE")) exec_compiler(argc, argv, NULL, 0);
  if (for_python(argc, argv)) exec_python(argc, argv); /* @FILE, -x c FILE: read there */
  const char *stage = link_stage(argc, argv); /* an LTO link by lld: link-time policies' */
  char level_buf[64];
  const char *level = stage || optimizes(argc, argv)
                          ? opt_level(argc, argv, level_buf, sizeof level_buf)
                          : NULL;
  if (!level) exec_compiler(argc, argv, NULL, 0);
  const char *guard_name = getenv("MLGO_GUARD");
  int guarding = guard_name && *guard_name;
  if (guarding && stage) exec_python(argc, argv); /* a guarded link: Python links it twice */
  if (guarding && strcmp(guard_name, "size") != 0) exec_python(argc, argv); /* it warns */

  double timeout = timeout_s();
  if (timeout < 0) exec_python(argc, argv);
  /* MLGO_TIMEOUT bounds the whole compilation, the lease included; the lease itself at most
   * MLGO_LEASE_WAIT_MS (mlgo.serve.cc.CONNECT_TIMEOUT_S): a service silent that long is not
   * answering. */
  long long began = now_ms();
  long long deadline = began + (long long)(timeout >= 1e12 ? 1e15 : timeout * 1000 + 0.999);
  long long lease_by = began + MLGO_LEASE_WAIT_MS;
  if (lease_by > deadline) lease_by = deadline;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  char runtime[PATH_MAX];
  if (!socket_path(addr.sun_path, sizeof addr.sun_path, runtime, sizeof runtime))
    exec_python(argc, argv); /* no service or not ours: Python starts one or says why */
  char busy[PATH_MAX + 96];
  snprintf(busy, sizeof busy, "the mlgo service at %s did not answer within %g s", addr.sun_path,
           (double)(lease_by - began) / 1000);
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  /* A Unix socket's connect cannot be polled: with the listener's backlog full a nonblocking
   * one fails at once (EAGAIN), a blocking one waits for a free slot as long as the send
   * timeout says. So it waits until the lease's deadline, then the service is busy, not
   * absent: never Python's cue to start another one. */
  int wait_ms = left_ms(lease_by);
  struct timeval send_by = {wait_ms / 1000, (wait_ms % 1000) * 1000 + 1}; /* 0 would be never */
  if (sock < 0 || setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &send_by, sizeof send_by) != 0)
    exec_python(argc, argv);
  if (connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0) {
    if (errno != EAGAIN) exec_python(argc, argv); /* no one listens: Python starts a service */
    close(sock);
    return fall_back(argc, argv, busy, stage != NULL);
  }
  struct ucred peer;
  socklen_t peer_len = sizeof peer;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 ||
      peer.uid != getuid()) {
    close(sock); /* served by someone else: Python refuses it with the reason */
    exec_python(argc, argv);
  }
  char *line = malloc(LINE_MAX_BYTES);
  char *flags[MAX_FLAGS];
  int n_flags;
  const char *language = stage ? NULL : source_language(argc, argv, cxx); /* a link has none */
  const char *quote = language ? "\"" : "";
  snprintf(line, LINE_MAX_BYTES,
           "{\"op\": \"compile\", \"level\": \"%s\", \"language\": %s%s%s, \"stage\": \"%s\", "
           "\"native\": \"%s\"}\n",
           level, quote, language ? language : "null", quote, stage ? stage : "compile",
           MLGO_BUILD_ID);
  int got = send_all(sock, line) ? -1 : read_line(sock, line, LINE_MAX_BYTES, lease_by);
  if (got == TIMED_OUT || (got < 0 && errno == EAGAIN)) { /* sent or answered too late */
    close(sock);
    return fall_back(argc, argv, busy, stage != NULL);
  }
  if (got < 0 || (n_flags = json_strings(line, "flags", flags, MAX_FLAGS)) < 0) {
    close(sock);
    exec_python(argc, argv);
  }
  char *note = json_field(line, "note");
  if (note) fprintf(stderr, "mlgo-cc: note: %s (first: %s)\n", note, first_source(argc, argv));
  if (!strstr(line, "\"lease\": ")) { /* no policy serves this level or language */
    close(sock);
    exec_compiler(argc, argv, NULL, 0);
  }
  if (!lease_flags_ok(flags, n_flags, runtime) || !policies_match(line) ||
      (stage && !at_link(flags, &n_flags))) {
    close(sock); /* ends the lease */
    exec_python(argc, argv);
  }
  if (strstr(line, "\"guard\": ")) { /* a policy shipped guarded is served so */
    if (stage || !strstr(line, "\"guard\": \"size\"")) { /* Python links it twice */
      send_all(sock, "{\"op\": \"done\", \"handed_over\": true}\n"); /* counted once */
      close(sock);
      exec_python(argc, argv);
    }
    guarding = 1; /* a compile: guarded here, as MLGO_GUARD=size is */
  }

  /* Guarded before by the plugin, its files unchanged: compiled once, as the guard chose. */
  int by_plugin = 0;
  for (int i = 0; i < n_flags; i++) by_plugin |= plugin_of(flags[i]) != NULL;
  if (guarding && !stage && by_plugin && guarded_object(argc, argv, guard.obj, sizeof guard.obj) &&
      memo_name(argc, argv, flags, n_flags)) {
    int winner = memo_lookup();
    if (winner != MEMO_MISS) guarding = 0, memo[0] = 0;
    if (winner == MEMO_DEFAULT) n_flags = 0; /* clang's own, under the lease all the same */
  }

  const char *tmp = temp_dir();
  char err_path[PATH_MAX], marks_path[PATH_MAX];
  snprintf(err_path, sizeof err_path, "%s/mlgo-cc-XXXXXX", tmp);
  snprintf(marks_path, sizeof marks_path, "%s/%sXXXXXX", tmp, MLGO_DEPARTURES_PREFIX);
  int err_fd = mkstemp(err_path);
  if (err_fd < 0) {
    char problem[PATH_MAX + 96];
    snprintf(problem, sizeof problem, "cannot create a temporary file in %s (%s)", tmp,
             strerror(errno));
    close(sock); /* ends the lease */
    return fall_back(argc, argv, problem, stage != NULL);
  }
  unlink(err_path);
  fcntl(err_fd, F_SETFD, FD_CLOEXEC);
  /* Served by the plugin, the compile says whether it made clang's own object: then the
   * guard's compile runs after it, if at all. Otherwise both run at once. */
  int marks_fd = -1;
  for (int i = 0; guarding && !stage && i < n_flags && marks_fd < 0; i++)
    if (plugin_of(flags[i])) marks_fd = mkstemp(marks_path);
  if (marks_fd >= 0) fcntl(marks_fd, F_SETFD, FD_CLOEXEC);
  /* A compile that writes no dependency list of its own (a plain Makefile's) writes one into
   * the scratch, so that where the plugin makes clang's own object it is remembered too. */
  char deps_path[PATH_MAX] = "", *compile_flags[MAX_FLAGS + 3];
  int n_compile = n_flags;
  memcpy(compile_flags, flags, (size_t)n_flags * sizeof *flags);
  if (marks_fd >= 0 && memo[0] && writes_no_dependencies(argc, argv)) {
    int fits = snprintf(deps_path, sizeof deps_path, "%s/%sdeps-XXXXXX", tmp,
                        MLGO_DEPARTURES_PREFIX) < (int)sizeof deps_path;
    int deps_fd = fits ? mkstemp(deps_path) : -1;
    if (deps_fd >= 0) {
      close(deps_fd);
      compile_flags[n_compile++] = "-MD";
      compile_flags[n_compile++] = "-MF";
      compile_flags[n_compile++] = deps_path;
    } else {
      deps_path[0] = '\0';
    }
  }
  if (guarding && marks_fd < 0 && guard_start(argc, argv, runtime) < 0) {
    close(sock);
    exec_python(argc, argv);
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(err_fd, 2);
    if (marks_fd >= 0) setenv(MLGO_DEPARTURES_ENV, marks_path, 1);
    exec_compiler(argc, argv, compile_flags, n_compile);
  }
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  char *problem = NULL;
  int status = 0;
  struct pollfd watch[2] = {{pidfd, POLLIN, 0}, {sock, POLLIN, 0}};
  int ready = poll(watch, 2, left_ms(deadline));
  if (ready > 0 && (watch[0].revents & POLLIN)) {
    waitpid(pid, &status, 0);
  } else {
    if (ready == 0) {
      problem = malloc(128);
      snprintf(problem, 128, "no result within MLGO_TIMEOUT=%g s", timeout);
    } else if (read_line(sock, line, LINE_MAX_BYTES, now_ms() + 1000) < 0 ||
               !(problem = json_field(line, "message"))) {
      problem = strdup("the mlgo service went away during the compilation");
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  char done[64];
  snprintf(done, sizeof done, "{\"op\": \"done\", \"returncode\": %d}\n", rc);
  char *errors[MAX_FLAGS];
  int n_errors = -1;
  /* After a timeout the answer is not awaited (as in mlgo.serve.cc): whatever hung may hold it
   * up too, and MLGO_TIMEOUT bounds the whole compilation. */
  if (send_all(sock, done) == 0 && ready != 0) {
    long long tally_by = now_ms() + 30000; /* all events and the tally: a service that keeps
                                             * sending events cannot hold the build */
    while ((got = read_line(sock, line, LINE_MAX_BYTES, tally_by)) >= 0 &&
           strstr(line, "\"event\"")) {
      if (!problem) problem = json_field(line, "message");
    }
    if (got >= 0) n_errors = json_strings(line, "errors", errors, MAX_FLAGS);
  }
  if (!problem && n_errors > 0) problem = errors[0];
  if (!problem && n_errors < 0)
    problem = strdup("the mlgo service went away during the compilation");
  if (!problem && WIFSIGNALED(status)) {
    problem = malloc(96);
    snprintf(problem, 96, "the compiler died of signal %d", WTERMSIG(status));
  }
  close(sock);
  if (marks_fd >= 0) {
    int made_default = !problem && rc == 0 && made_default_object(marks_fd);
    unlink(marks_path);
    close(marks_fd);
    /* Clang's own object: a rebuild compiles it so, without the plugin, if it is remembered. */
    const char *deps = own_dependencies(argc, argv);
    if (!deps && deps_path[0]) deps = deps_path;
    if (made_default && memo[0] && deps) memo_store(MEMO_DEFAULT, deps);
    if (deps_path[0]) unlink(deps_path);
    if (!problem && rc == 0 && !made_default && guard_start(argc, argv, runtime) < 0)
      exec_python(argc, argv);
  }
  if (!problem && rc == 0 && guard.pid && guard_keep_smaller() != 0) {
    guard_stop();
    exec_python(argc, argv); /* does it all again and says what is wrong with the guard */
  }
  guard_stop();
  const char *source = first_source(argc, argv);
  int strict = getenv("MLGO_STRICT") != NULL;
  if (!problem && rc != 0 && !strict)
    return compile_plain_after(rc, err_fd, argc, argv, source, stage != NULL);
  if (!problem) {
    copy_to_stderr(err_fd);
    return rc;
  }
  return fall_back(argc, argv, problem, stage != NULL);
}
