// policy_server: answers LLVM's interactive channels with an AOT-compiled policy.
//
// Built by mlgo/ship/aot.py against the `model.h` that `saved_model_cli aot_compile_cpu` writes
// (class `Model`). It is long-lived: the mlgo service starts it once and drives it over
// stdin/stdout with one-line commands, so no Python runs per decision.
//
//   serve ID BASE   serve channel BASE.in/BASE.out in a thread, for every compiler that
//                   opens it, until `cancel ID`
//   cancel ID       stop serving ID (the service then releases a blocked open)
//   stats           print `stats DECISIONS P50_NS P90_NS P99_NS MAX_NS`
//   replay LOG OUT  answer every observation of a recorded log file into OUT (for checks)
//
// Replies (one line each): `session ID DECISIONS` after each compiler finishes,
// `error ID MESSAGE` when a channel fails (later compilers on it then get EOF at once,
// so none can hang), `closed ID` when its thread ends.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model.h"

namespace {

// ---- a minimal JSON reader, enough for the training-log header and event lines ----

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json* get(const std::string& key) const {
    for (const auto& f : fields)
      if (f.first == key) return &f.second;
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json parse() {
    Json v = value();
    skip();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const char* what) {
    throw std::runtime_error(std::string("bad JSON (") + what + ") in: " + s_.substr(0, 120));
  }
  void skip() {
    while (i_ < s_.size() && strchr(" \t\r\n", s_[i_])) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  std::string str() {
    if (!eat('"')) fail("expected a string");
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    skip();
    Json v;
    if (i_ >= s_.size()) fail("unexpected end");
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Json::kObject;
      if (eat('}')) return v;
      do {
        std::string key = str();
        if (!eat(':')) fail("expected ':'");
        v.fields.emplace_back(key, value());
      } while (eat(','));
      if (!eat('}')) fail("expected '}'");
    } else if (c == '[') {
      ++i_;
      v.kind = Json::kArray;
      if (eat(']')) return v;
      do v.items.push_back(value());
      while (eat(','));
      if (!eat(']')) fail("expected ']'");
    } else if (c == '"') {
      v.kind = Json::kString;
      v.text = str();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 4, "null") == 0) {
      v.kind = s_[i_] == 't' ? Json::kBool : Json::kNull;
      v.number = s_[i_] == 't';
      i_ += 4;
    } else if (s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::kBool;
      i_ += 5;
    } else {
      char* end = nullptr;
      v.kind = Json::kNumber;
      v.number = strtod(s_.c_str() + i_, &end);
      if (end == s_.c_str() + i_) fail("unexpected character");
      i_ = end - s_.c_str();
    }
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

// ---- tensor specs and the feature layout ----

size_t type_bytes(const std::string& type) {
  static const std::map<std::string, size_t> sizes = {
      {"int64_t", 8}, {"int32_t", 4}, {"int8_t", 1}, {"uint8_t", 1}, {"float", 4}, {"double", 8}};
  auto it = sizes.find(type);
  if (it == sizes.end()) throw std::runtime_error("unknown tensor type " + type);
  return it->second;
}

struct Spec {
  std::string name;
  size_t bytes;
};

Spec parse_spec(const Json& j) {
  const Json* name = j.get("name");
  const Json* type = j.get("type");
  const Json* shape = j.get("shape");
  if (!name || !type || !shape) throw std::runtime_error("tensor spec without name/type/shape");
  size_t n = type_bytes(type->text);
  for (const auto& d : shape->items) n *= static_cast<size_t>(d.number);
  return {name->text, n};
}

// Where each model argument's bytes sit in an observation block.
struct Layout {
  std::vector<std::pair<int, size_t>> args;  // (model arg index, offset in block)
  size_t block_bytes = 0;
  size_t advice_bytes = 0;
};

Layout match_layout(const std::string& header_line, Model& model) {
  Json header = JsonParser(header_line).parse();
  const Json* features = header.get("features");
  const Json* advice = header.get("advice");
  if (!features || !advice) throw std::runtime_error("channel header lacks features or advice");
  std::map<std::string, std::pair<size_t, size_t>> sent;  // name -> (offset, bytes)
  Layout layout;
  for (const auto& f : features->items) {
    Spec s = parse_spec(f);
    sent[s.name] = {layout.block_bytes, s.bytes};
    layout.block_bytes += s.bytes;
  }
  for (int i = 0; i < model.num_args(); ++i) {
    const char* arg_name = model.GetArgName(i);
    if (!arg_name) throw std::runtime_error("the policy was compiled without argument names");
    std::string name = arg_name;
    if (name.rfind("feed_", 0) == 0) name = name.substr(5);
    auto it = sent.find(name);
    if (it == sent.end())
      throw std::runtime_error("feature layout mismatch: the policy needs '" + name +
                               "', which this compiler does not send");
    if (it->second.second != static_cast<size_t>(model.arg_size(i)))
      throw std::runtime_error("feature layout mismatch: '" + name + "' is " +
                               std::to_string(it->second.second) + " bytes from the compiler, " +
                               std::to_string(model.arg_size(i)) + " in the policy");
    layout.args.emplace_back(i, it->second.first);
  }
  layout.advice_bytes = parse_spec(*advice).bytes;
  if (layout.advice_bytes != static_cast<size_t>(model.result_size(0)))
    throw std::runtime_error("advice is " + std::to_string(layout.advice_bytes) +
                             " bytes for the compiler, " + std::to_string(model.result_size(0)) +
                             " from the policy");
  return layout;
}

// ---- latency statistics: a log-linear histogram of nanoseconds per decision ----

class Latencies {
 public:
  void add(uint64_t ns) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[bucket(ns)];
    ++total_;
    if (ns > max_) max_ = ns;
  }
  std::string report() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = "stats " + std::to_string(total_);
    for (double q : {0.5, 0.9, 0.99}) out += " " + std::to_string(quantile(q));
    return out + " " + std::to_string(max_);
  }

 private:
  static constexpr int kSub = 16;  // 16 buckets per power of two: ~4% resolution
  static int bucket(uint64_t ns) {
    if (ns < kSub) return static_cast<int>(ns);
    int exp = 63 - __builtin_clzll(ns);
    return (exp - 3) * kSub + static_cast<int>((ns >> (exp - 4)) & (kSub - 1));
  }
  static uint64_t lower_bound(int b) {
    if (b < kSub) return b;
    int exp = b / kSub + 3;
    return (uint64_t{1} << exp) + (static_cast<uint64_t>(b % kSub) << (exp - 4));
  }
  uint64_t quantile(double q) const {
    uint64_t rank = static_cast<uint64_t>(q * total_), seen = 0;
    for (int b = 0; b < kBuckets; ++b)
      if ((seen += counts_[b]) > rank) return lower_bound(b);
    return max_;
  }
  static constexpr int kBuckets = 64 * kSub;
  std::mutex mu_;
  uint64_t counts_[kBuckets] = {};
  uint64_t total_ = 0, max_ = 0;
};

Latencies latencies;
std::mutex out_mu;

void reply(const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mu);
  fprintf(stdout, "%s\n", line.c_str());
  fflush(stdout);
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

// ---- serving ----

// Lines of one stream; getline's buffer is freed with the reader (a thread per channel).
class LineReader {
 public:
  explicit LineReader(FILE* in) : in_(in) {}
  ~LineReader() { free(buf_); }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  bool next(std::string* line) {
    ssize_t n = getline(&buf_, &cap_, in_);
    if (n <= 0) return false;
    if (buf_[n - 1] != '\n') throw std::runtime_error("stream ended inside a line");
    line->assign(buf_, static_cast<size_t>(n - 1));
    return true;
  }

 private:
  FILE* in_;
  char* buf_ = nullptr;
  size_t cap_ = 0;
};

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Answers every observation on `in` into `advice_fd`; returns the number of decisions.
uint64_t answer_all(FILE* in, int advice_fd, Model& model) {
  std::string line;
  LineReader lines(in);
  if (!lines.next(&line)) return 0;  // the compiler closed without a word
  Layout layout = match_layout(line, model);
  std::vector<char> block(layout.block_bytes + 1);
  uint64_t decisions = 0;
  while (lines.next(&line)) {
    if (line.rfind("{\"context\"", 0) == 0) continue;
    if (line.rfind("{\"observation\"", 0) != 0)
      throw std::runtime_error("unexpected log event: " + line.substr(0, 80));
    if (fread(block.data(), 1, block.size(), in) != block.size())
      throw std::runtime_error("stream ended inside an observation");
    if (block.back() != '\n') throw std::runtime_error("missing newline after a tensor block");
    auto start = std::chrono::steady_clock::now();
    for (const auto& [arg, offset] : layout.args)
      memcpy(model.arg_data(arg), block.data() + offset, model.arg_size(arg));
    if (!model.Run()) throw std::runtime_error("policy failed: " + model.error_msg());
    if (!write_all(advice_fd, model.result_data(0), layout.advice_bytes))
      throw std::runtime_error("compiler went away while waiting for advice");
    latencies.add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count());
    ++decisions;
  }
  return decisions;
}

struct Channel {
  std::string id, base;
  std::atomic<bool> cancelled{false};
};

// Serves compiler after compiler on one channel until cancelled. After a failure every
// later compiler gets EOF at once (it then fails and mlgo-cc falls back), never a hang.
void serve_channel(std::shared_ptr<Channel> ch) {
  Model model;
  bool failed = false;
  while (!ch->cancelled) {
    int advice_fd = open((ch->base + ".in").c_str(), O_WRONLY);  // the compiler opens .in first
    if (advice_fd < 0) break;                                    // unlinked: the lease is over
    FILE* in = ch->cancelled ? nullptr : fopen((ch->base + ".out").c_str(), "rb");
    if (in && !failed && !ch->cancelled) {
      try {
        uint64_t n = answer_all(in, advice_fd, model);
        reply("session " + ch->id + " " + std::to_string(n));
      } catch (const std::exception& e) {
        failed = true;
        reply("error " + ch->id + " " + one_line(e.what()));
      }
    }
    if (in) fclose(in);
    close(advice_fd);
    if (failed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  reply("closed " + ch->id);
}

int replay(const std::string& log_path, const std::string& out_path) {
  FILE* in = fopen(log_path.c_str(), "rb");
  int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!in || out < 0) throw std::runtime_error("cannot open " + log_path + " or " + out_path);
  Model model;
  uint64_t n = answer_all(in, out, model);
  fclose(in);
  close(out);
  return static_cast<int>(n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "replay") {  // one-shot, for tests and checks
    try {
      printf("%d\n", replay(argv[2], argv[3]));
      return 0;
    } catch (const std::exception& e) {
      fprintf(stderr, "policy_server: %s\n", e.what());
      return 1;
    }
  }
  std::map<std::string, std::shared_ptr<Channel>> channels;
  char buf[8192];
  while (fgets(buf, sizeof buf, stdin)) {
    char verb[16] = {}, id[256] = {}, arg[4096] = {};
    int n = sscanf(buf, "%15s %255s %4095s", verb, id, arg);
    std::string v = verb;
    if (v == "serve" && n == 3) {
      auto ch = std::make_shared<Channel>();
      ch->id = id;
      ch->base = arg;
      channels[id] = ch;
      std::thread(serve_channel, ch).detach();
    } else if (v == "cancel" && n == 2) {
      auto it = channels.find(id);
      if (it != channels.end()) {
        it->second->cancelled = true;
        channels.erase(it);
      }
    } else if (v == "stats") {
      reply(latencies.report());
    } else {
      reply("error - unknown command: " + one_line(buf));
    }
  }
  return 0;  // stdin closed: the service is gone, and so are we
}
