/* mlgo-cc / mlgo-c++, native fast path.
 *
 * A Python wrapper costs 40-70 ms of CPU per compiler invocation (interpreter start-up and
 * imports), as much as a small C file takes to compile; this program does the common case
 * with none of that. It mirrors mlgo/serve/cc.py, which stays the reference and handles every
 * uncommon case: whenever the service is not there (start it on demand), the reply is not
 * understood, or anything else unusual happens, this program execs `python -m mlgo.serve.cc`
 * with the same arguments, so messages and fallbacks live in one place. That includes all
 * it does not trust: a socket or directory not this user's alone, a peer of another uid
 * (SO_PEERCRED), a lease flag outside what mlgo.serve.cc.check_lease_flags allows, policies
 * other than MLGO_POLICY names, and an MLGO_TIMEOUT that is not a plain positive number.
 * MLGO_GUARD (two compiles a file) is Python's too. A compile at an -O level no served policy
 * was trained for gets a reply without a lease: it runs the compiler as is, after the
 * service's note if the reply has one (the first compile at that level).
 * Built by `mlgo install-wrappers` with -DMLGO_PYTHON="<the venv's python>". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MLGO_PYTHON
#error "build with -DMLGO_PYTHON=\"/path/to/python\""
#endif

#define MAX_FLAGS 64
#define LINE_MAX_BYTES 65536

static const char *source_suffixes[] = {".c", ".cc", ".cpp", ".cxx", ".c++", ".C",
                                        ".i", ".ii", ".m",   ".mm",  NULL};
static const char *no_codegen[] = {"-E",  "-M",        "-MM",    "-fsyntax-only", "-###",
                                   "--version", "--help", "-", NULL};

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Same rule as mlgo.serve.cc.optimizes: a source file is compiled, no flag says otherwise. */
static int optimizes(int argc, char **argv) {
  int source = 0;
  for (int i = 1; i < argc; i++) {
    for (const char **f = no_codegen; *f; f++)
      if (strcmp(argv[i], *f) == 0) return 0;
    if (strncmp(argv[i], "-mllvm", 6) == 0) return 0;
    if (argv[i][0] != '-')
      for (const char **s = source_suffixes; *s; s++)
        if (ends_with(argv[i], *s)) source = 1;
  }
  return source;
}

/* Same rule as mlgo.serve.cc.opt_level: the last -O flag as clang's driver reads it, NULL for
 * a level clang refuses. BUF holds an --optimize=X level. */
static const char *opt_level(int argc, char **argv, char *buf, size_t cap) {
  static const char *named[] = {"-Os", "-Oz", "-Og", "-Ofast", NULL};
  static const char *numbered[] = {"-O0", "-O1", "-O2", "-O3"};
  const char *level = "-O0";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] == '-' && a[1] == 'X' && a[2]) /* -Xclang X, -Xlinker X: another tool's */
      i++;
    else if (strcmp(a, "--optimize") == 0)
      level = "-O";
    else if (strncmp(a, "--optimize=", 11) == 0)
      snprintf(buf, cap, "-O%s", a + 11), level = buf;
    else if (strncmp(a, "-O", 2) == 0 && strcmp(a, "-ObjC") && strcmp(a, "-ObjC++"))
      level = a;
  }
  const char *digits = level + 2;
  if (!*digits) return numbered[1];
  if (strspn(digits, "0123456789") == strlen(digits)) {
    while (digits[0] == '0' && digits[1]) digits++;
    return digits[1] || digits[0] > '3' ? numbered[3] : numbered[digits[0] - '0'];
  }
  for (const char **n = named; *n; n++)
    if (strcmp(level, *n) == 0) return *n;
  return NULL;
}

/* The first source file, as mlgo.serve.cc names it in its messages. */
static const char *first_source(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    for (const char **s = source_suffixes; *s; s++)
      if (argv[i][0] != '-' && ends_with(argv[i], *s)) return argv[i];
  return "?";
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

/* Ours alone, as mlgo.serve.client.check_owned says: this user owns it, no one else may write. */
static int owned(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_uid == getuid() && !(st.st_mode & 022);
}

/* The socket into OUT and its directory (the runtime directory) into DIR, both trusted. */
static int socket_path(char *out, size_t cap, char *dir, size_t dir_cap) {
  const char *explicit_path = getenv("MLGO_SOCKET");
  if (explicit_path) {
    const char *slash = strrchr(explicit_path, '/');
    if (!slash) snprintf(dir, dir_cap, ".");
    else if (slash == explicit_path) snprintf(dir, dir_cap, "/");
    else snprintf(dir, dir_cap, "%.*s", (int)(slash - explicit_path), explicit_path);
    return snprintf(out, cap, "%s", explicit_path) < (int)cap && owned(dir) && owned(out);
  }
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg)
    snprintf(dir, dir_cap, "%s/mlgo", xdg);
  else
    snprintf(dir, dir_cap, "/tmp/mlgo-%u", (unsigned)getuid());
  struct stat st; /* the same privacy rule as mlgo.serve.client.runtime_dir */
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 077))
    return 0;
  return snprintf(out, cap, "%s/mlgo.sock", dir) < (int)cap && owned(out);
}

static int read_line(int fd, char *buf, size_t cap, int timeout_ms) {
  size_t n = 0;
  while (n + 1 < cap) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return -1;
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

/* Where the lease's plugins must come from: mlgo.runtime.files.cache_dir()/plugin, resolved. */
static int plugin_cache(char *out) {
  const char *root = getenv("MLGO_CACHE"), *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  char dir[PATH_MAX];
  int n;
  if (root && *root)
    n = snprintf(dir, sizeof dir, "%s/plugin", root);
  else if (xdg && *xdg)
    n = snprintf(dir, sizeof dir, "%s/mlgo/plugin", xdg);
  else if (home && *home)
    n = snprintf(dir, sizeof dir, "%s/.cache/mlgo/plugin", home);
  else
    return 0;
  return n < (int)sizeof dir && realpath(dir, out) != NULL;
}

/* Same rule as mlgo.serve.cc.check_lease_flags: the known switches, a channel option on a FIFO
 * base directly in RUNTIME/channels, or a plugin inside the cache of built plugins. */
static int lease_flags_ok(char **flags, int n, const char *runtime) {
  static const char *switches[] = {"-enable-ml-inliner=release",
                                   "-inliner-interactive-include-default",
                                   "-regalloc-enable-advisor=release", NULL};
  static const char *channels[] = {"-inliner-interactive-channel-base=",
                                   "-regalloc-evict-interactive-channel-base=", NULL};
  char want[PATH_MAX], dir[PATH_MAX], got[PATH_MAX], plugins[PATH_MAX];
  if (snprintf(dir, sizeof dir, "%s/channels", runtime) >= (int)sizeof dir || !realpath(dir, want))
    return 0;
  for (int i = 0; i < n; i++) {
    if (strncmp(flags[i], "-fpass-plugin=", 14) == 0) {
      size_t len;
      if (!plugin_cache(plugins) || !realpath(flags[i] + 14, got)) return 0;
      len = strlen(plugins);
      if (strncmp(got, plugins, len) != 0 || got[len] != '/') return 0;
      continue;
    }
    if (strcmp(flags[i], "-mllvm") != 0 || ++i == n) return 0;
    int ok = 0;
    for (const char **s = switches; *s; s++) ok |= strcmp(flags[i], *s) == 0;
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

int main(int argc, char **argv) {
  int cxx = ends_with(argv[0], "++");
  lang = cxx ? "c++" : "cc";
  compiler = getenv(cxx ? "MLGO_CXX" : "MLGO_CC");
  if (!compiler) compiler = cxx ? "clang++-22" : "clang-22";
  char level_buf[64];
  const char *level = optimizes(argc, argv) ? opt_level(argc, argv, level_buf, sizeof level_buf)
                                            : NULL;
  if (getenv("MLGO_DISABLE") || !level) exec_compiler(argc, argv, NULL, 0);
  const char *guard = getenv("MLGO_GUARD");
  if (guard && *guard) exec_python(argc, argv);

  double timeout = timeout_s();
  if (timeout < 0) exec_python(argc, argv);
  int timeout_ms = timeout * 1000 >= INT_MAX ? INT_MAX : (int)(timeout * 1000 + 0.999);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  char runtime[PATH_MAX];
  if (!socket_path(addr.sun_path, sizeof addr.sun_path, runtime, sizeof runtime))
    exec_python(argc, argv); /* no service or not ours: Python starts one or says why */
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) != 0)
    exec_python(argc, argv);
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
  snprintf(line, LINE_MAX_BYTES, "{\"op\": \"compile\", \"level\": \"%s\"}\n", level);
  if (send_all(sock, line) || read_line(sock, line, LINE_MAX_BYTES, 10000) < 0 ||
      (n_flags = json_strings(line, "flags", flags, MAX_FLAGS)) < 0) {
    close(sock);
    exec_python(argc, argv);
  }
  char *note = json_field(line, "note");
  if (note) fprintf(stderr, "mlgo-cc: note: %s (first: %s)\n", note, first_source(argc, argv));
  if (!strstr(line, "\"lease\": ")) { /* no policy serves this level */
    close(sock);
    exec_compiler(argc, argv, NULL, 0);
  }
  if (!lease_flags_ok(flags, n_flags, runtime) || !policies_match(line)) {
    close(sock); /* ends the lease */
    exec_python(argc, argv);
  }

  char err_path[] = "/tmp/mlgo-cc-XXXXXX";
  int err_fd = mkstemp(err_path);
  if (err_fd < 0) exec_python(argc, argv);
  unlink(err_path);
  fcntl(err_fd, F_SETFD, FD_CLOEXEC);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(err_fd, 2);
    exec_compiler(argc, argv, flags, n_flags);
  }
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  char *problem = NULL;
  int status = 0;
  struct pollfd watch[2] = {{pidfd, POLLIN, 0}, {sock, POLLIN, 0}};
  int ready = poll(watch, 2, timeout_ms);
  if (ready > 0 && (watch[0].revents & POLLIN)) {
    waitpid(pid, &status, 0);
  } else {
    if (ready == 0) {
      problem = malloc(128);
      snprintf(problem, 128, "no result within MLGO_TIMEOUT=%g s", timeout);
    } else if (read_line(sock, line, LINE_MAX_BYTES, 1000) < 0 ||
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
    int got;
    while ((got = read_line(sock, line, LINE_MAX_BYTES, 30000)) >= 0 &&
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
  if (!problem) {
    char buf[65536];
    ssize_t n;
    lseek(err_fd, 0, SEEK_SET);
    while ((n = read(err_fd, buf, sizeof buf)) > 0)
      if (write(2, buf, (size_t)n) != n) break;
    return rc;
  }
  const char *source = first_source(argc, argv);
  if (getenv("MLGO_STRICT")) {
    fprintf(stderr, "mlgo-cc: error: %s (%s)\n", problem, source);
    return 1;
  }
  fprintf(stderr, "mlgo-cc: warning: %s; compiling %s with the default heuristic\n", problem,
          source);
  exec_compiler(argc, argv, NULL, 0);
}
