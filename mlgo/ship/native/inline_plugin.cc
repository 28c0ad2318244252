// mlgo's inlining policy inside clang: an LLVM pass plugin (`clang -fpass-plugin=...`).
//
// LLVM's own "release mode" embeds a compiled model in clang at LLVM's build time; a
// stock clang has none. This plugin gives a stock clang the same at run time: it
// registers an inline advisor (PluginInlineAdvisorAnalysis) that is LLVM's MLInlineAdvisor,
// with a model runner that evaluates the policy in-process. LLVM computes the features
// exactly as it does for the interactive channel, so the decisions are the policy's,
// with no FIFO, no context switch and no second process per call site.
//
// The policy (quantile normalization, then an MLP; see mlgo/problems/policy.py) is the
// constants policy_constants.h declares, which mlgo/ship/plugin.py defines and links in.
// The arithmetic follows the numpy reference: features and quantiles in double, the
// network in float, argmax first-wins. A gated policy (kGated) follows LLVM's own decision
// unless the other answer's logit margin reaches kDepartureMargin; the advisor asks LLVM's
// default at the point where the interactive channel's
// -inliner-interactive-include-default does, just before the model.
//
// A feature is an int64 or float tensor by name and an element of it (kFeatureElement: 0
// for a scalar; IR2Vec's embeddings are float vectors, sent when clang is given a
// vocabulary, which the problem's feature flags do).
// If the policy needs a feature this clang does not send, the plugin says so in one line
// on stderr and uses LLVM's default inliner for the compilation: never a failed build.
// A profile's inputs (mlgo/problems/profile_inputs.py: how often the call site ran, how
// often its callee was entered, the profile's hot or cold) are no tensor of LLVM's: the
// plugin computes them at each call site, from the caller's block frequencies and the
// profile summary, just before the model (0, 0 and neither without a profile).
//
// The decisions recorder (mlgo/ship/decisions.py reads what it writes): with
// kDecisionsOutEnv naming a file, every non-mandatory advice is appended to it as a line of
// clang's own -cgscc-inline-replay format, keyed by LLVM's formatCallSiteLocation, so that
// plain clang can replay the compile. kDecisionsAdvisorEnv chooses whose advice: the
// policy's (unset), clang's own (kClangAdvisor), or clang's replay of a file
// (kReplayAdvisorPrefix + path), which tells which of the file's decisions still meet a
// site, or a trajectory's answers in order (kAnswersAdvisorPrefix + path: `AnswersRunner`).
// Whoever advises, an inline clang would refuse (not viable, or by attributes) is answered
// "no" and marked (kNotViable): clang's replay does not check. Environment variables, not cl::opts: clang parses -mllvm before it loads a
// -fpass-plugin, so an option of the plugin's would be an unknown argument there.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "llvm/Analysis/IR2Vec.h"
#include "llvm/Analysis/InlineAdvisor.h"
#include "llvm/Analysis/InlineCost.h"
#include "llvm/Analysis/TargetLibraryInfo.h"
#include "llvm/Analysis/TargetTransformInfo.h"
#include "llvm/Analysis/MLInlineAdvisor.h"
#include "llvm/Analysis/MLModelRunner.h"
#include "llvm/Analysis/BlockFrequencyInfo.h"
#include "llvm/Analysis/ProfileSummaryInfo.h"
#include "llvm/Analysis/ReplayInlineAdvisor.h"
#include "llvm/Analysis/TensorSpec.h"
#include "llvm/Analysis/InlineModelFeatureMaps.h"
#include "llvm/Analysis/Utils/TrainingLogger.h"
#include "llvm/IR/Module.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Plugins/PassPlugin.h"
#include "llvm/Support/raw_ostream.h"
#include "policy_constants.h"

using namespace llvm;

namespace {

// The advisor factory gets no ModuleAnalysisManager, which MLInlineAdvisor needs; clang
// builds one per compilation and registers the plugin's analysis with it first. One per
// thread: lld's ThinLTO backends optimize modules side by side, each on its own thread with
// its own manager, and an advisor built on another module's manager crashes the link.
thread_local ModuleAnalysisManager *CompilationMAM = nullptr;

// The profile's inputs a policy may read (their names are kCallSiteCountName and the rest).
enum ProfileInput { kCallSiteCount, kCalleeEntryCount, kCallSiteHotness, kProfileInputs };

// Which of them feature NAME is, or -1 for a tensor of LLVM's.
int profileInput(const char *Name) {
  const char *const Names[kProfileInputs] = {kCallSiteCountName, kCalleeEntryCountName,
                                             kCallSiteHotnessName};
  for (int P = 0; P < kProfileInputs; ++P)
    if (strcmp(Name, Names[P]) == 0) return P;
  return -1;
}

class PolicyRunner : public MLModelRunner {
 public:
  PolicyRunner(LLVMContext &Ctx, const std::vector<TensorSpec> &Inputs)
      : MLModelRunner(Ctx, Kind::Release, Inputs.size()),
        Raw(kFeatures + kDerived),
        H(kMaxWidth),
        Next(kMaxWidth),
        Index(kFeatures),
        IsFloat(kFeatures),
        FromProfile(kFeatures) {
    for (size_t I = 0; I < Inputs.size(); ++I) setUpBufferForTensor(I, Inputs[I], nullptr);
    for (int F = 0; F < kFeatures && Problem.empty(); ++F) {
      FromProfile[F] = profileInput(kFeatureNames[F]);
      ReadsProfile |= FromProfile[F] >= 0;
      if (FromProfile[F] >= 0) continue;
      auto It = std::find_if(Inputs.begin(), Inputs.end(),
                             [&](const TensorSpec &S) { return S.name() == kFeatureNames[F]; });
      if (It == Inputs.end())
        Problem = std::string("the policy needs '") + kFeatureNames[F] +
                  "', which this compiler does not send";
      else if (!It->isElementType<int64_t>() && !It->isElementType<float>())
        Problem = std::string("'") + kFeatureNames[F] + "' is neither int64 nor float here";
      else if (static_cast<size_t>(kFeatureElement[F]) >= It->getElementCount())
        Problem = std::string("'") + kFeatureNames[F] + "' has no element " +
                  std::to_string(kFeatureElement[F]) + " here";
      else {
        Index[F] = static_cast<size_t>(It - Inputs.begin());
        IsFloat[F] = It->isElementType<float>();
      }
    }
  }
  std::string Problem;  // empty when every feature the policy reads is sent
  int64_t Default = 0;  // LLVM's own decision at this call site (set only when kGated)
  bool ReadsProfile = false;
  double Profile[kProfileInputs] = {};  // this call site's (set only when ReadsProfile)

 protected:
  // The policy's answer at this decision: gated as GATED says, else the argmax.
  int64_t answer(bool Gated) {
    for (int F = 0; F < kFeatures; ++F)  // the profile's, a scalar, or one element of a vector
      Raw[F] = FromProfile[F] >= 0 ? Profile[FromProfile[F]]
               : IsFloat[F] ? static_cast<double>(getTensor<float>(Index[F])[kFeatureElement[F]])
                          : static_cast<double>(getTensor<int64_t>(Index[F])[kFeatureElement[F]]);
    for (int D = 0; D < kDerived; ++D) {
      double L = Raw[kDerivedLeft[D]], R = Raw[kDerivedRight[D]];
      Raw[kFeatures + D] = kDerivedOp[D] == '-' ? L - R : (L < R ? 1.0 : 0.0);
    }
    const int Columns = kFeatures + kDerived;
    for (int C = 0; C < Columns; ++C) {  // (q, sqrt q, q^2) of the value's quantile q
      const double *Begin = kQuantiles + kQuantileStart[C], *End = kQuantiles + kQuantileStart[C + 1];
      double Q = static_cast<double>(std::upper_bound(Begin, End, Raw[C]) - Begin) /
                 std::max<long>(End - Begin, 1);
      H[C] = static_cast<float>(Q);
      H[Columns + C] = static_cast<float>(std::sqrt(Q));
      H[2 * Columns + C] = static_cast<float>(Q * Q);
    }
    const float *W = kWeights;
    for (int L = 0; L < kLayers; ++L) {
      const float *B = W + kLayerIn[L] * kLayerOut[L];
      for (int O = 0; O < kLayerOut[L]; ++O) {
        float Sum = 0.0f;
        for (int I = 0; I < kLayerIn[L]; ++I) Sum += H[I] * W[I * kLayerOut[L] + O];
        Sum += B[O];
        Next[O] = (L + 1 < kLayers) ? std::max(Sum, 0.0f) : Sum;
      }
      std::copy(Next.begin(), Next.begin() + kLayerOut[L], H.begin());
      W = B + kLayerOut[L];
    }
    if (Gated) return H[1 - Default] - H[Default] >= kDepartureMargin ? 1 - Default : Default;
    return std::max_element(H.begin(), H.begin() + kLayerOut[kLayers - 1]) - H.begin();
  }

 private:
  void *evaluateUntyped() override {
    Advice = answer(kGated);
    return &Advice;
  }
  std::vector<double> Raw;      // the features, then the derived columns
  std::vector<float> H, Next;   // a layer's input and output
  std::vector<size_t> Index;    // each feature's input tensor
  std::vector<bool> IsFloat;
  std::vector<int> FromProfile;  // each feature's ProfileInput, or -1
  int64_t Advice = 0;
};

// The bytes of the file at PATH (not through a symlink) into OUT; false if unreadable.
bool readFile(const char *Path, std::string &Out, size_t Most) {
  int Fd = open(Path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  char Buffer[65536];
  ssize_t Got = 0;
  while (Fd >= 0 && (Got = read(Fd, Buffer, sizeof Buffer)) > 0 && Out.size() < Most)
    Out.append(Buffer, static_cast<size_t>(Got));
  if (Fd >= 0) close(Fd);
  return Fd >= 0 && Got >= 0;
}

// A trajectory's answers, one a decision in the order the advisor asks (as the interactive
// channel's compile of the same module asked them): the search's best, replayed here so
// that the recorder keys each answer by its call site. The file holds '0' and '1' bytes; a
// decision past its end is answered "no", and an unreadable file answers none (`Problem`).
class AnswersRunner final : public MLModelRunner {
 public:
  AnswersRunner(LLVMContext &Ctx, const std::vector<TensorSpec> &Inputs, const char *Path)
      : MLModelRunner(Ctx, Kind::Release, Inputs.size()) {
    for (size_t I = 0; I < Inputs.size(); ++I) setUpBufferForTensor(I, Inputs[I], nullptr);
    if (!readFile(Path, Answers, kMostAnswers))
      Problem = std::string("cannot read the answers in ") + Path;
    else if (Answers.find_first_not_of("01") != std::string::npos)
      Problem = std::string(Path) + " holds more than '0' and '1'";
  }
  std::string Problem;

 private:
  static constexpr size_t kMostAnswers = size_t(1) << 24;
  void *evaluateUntyped() override {
    Advice = Next < Answers.size() && Answers[Next] == '1';
    ++Next;
    return &Advice;
  }
  std::string Answers;
  size_t Next = 0;
  int64_t Advice = 0;
};

// A search's compile inside clang (mlgo/train/plugin_compile.py writes its spec and reads
// what this writes): the answers BC-Max's Answerer gives through the channel -- the base's
// (LLVM's own decision, or the policy's argmax), its group's where the trajectory sets one,
// flipped at the decision indices it names -- with every observation written as the channel
// would have sent it (LLVM's Logger; LLVM's own decision last, as
// -inliner-interactive-include-default sends it) to kTrajectoryLog beside the spec, and the
// answers given, '0' and '1' bytes, to kTrajectoryAnswers. No FIFO, no second process.
class TrajectoryRunner final : public PolicyRunner {
 public:
  TrajectoryRunner(LLVMContext &Ctx, const std::vector<TensorSpec> &Inputs, const char *Spec)
      : PolicyRunner(Ctx, Inputs), Specs(Inputs) {
    const std::string PolicyProblem = Problem;
    Problem.clear();
    std::string Text;
    if (!readFile(Spec, Text, size_t(1) << 26)) {
      Problem = std::string("cannot read the trajectory in ") + Spec;
      return;
    }
    parse(Text, Inputs);
    if (Problem.empty() && BasePolicy) Problem = PolicyProblem;
    if (!Problem.empty()) return;
    const std::string Spec_(Spec);
    const std::string Dir = Spec_.substr(0, Spec_.rfind('/') + 1);
    int Fd = open((Dir + kTrajectoryLog).c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (Fd < 0) {
      Problem = "cannot create " + Dir + kTrajectoryLog;
      return;
    }
    Specs.push_back(DefaultDecisionSpec);
    Log = std::make_unique<Logger>(std::make_unique<raw_fd_ostream>(Fd, true), Specs,
                                   InlineDecisionSpec, false, InlineDecisionSpec);
    AnswersPath = Dir + kTrajectoryAnswers;
  }
  ~TrajectoryRunner() override {
    if (!Log) return;
    Log.reset();  // flushed and closed before the answers say the compile is whole
    int Fd = open(AnswersPath.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (Fd < 0 || write(Fd, Answers.data(), Answers.size()) != static_cast<ssize_t>(Answers.size()))
      errs() << "mlgo: cannot write the answers to " << AnswersPath << "\n";
    if (Fd >= 0) close(Fd);
  }
  void switchContext(StringRef Name) override {  // MLInlineAdvisor's constructor calls it
    if (Log) Log->switchContext(Name);
    Context = Name.str();
  }

 private:
  // The spec's lines: `base default` or `base policy`; `group-feature NAME` for each of the
  // problem's group features, in order; `group V1 .. Vn ANSWER`; `flip INDEX`.
  void parse(const std::string &Text, const std::vector<TensorSpec> &Inputs) {
    std::istringstream Lines(Text);
    std::string Line, Word;
    while (Problem.empty() && std::getline(Lines, Line)) {
      std::istringstream Words(Line);
      if (!(Words >> Word)) continue;
      if (Word == "base" && Words >> Word && (Word == "default" || Word == "policy")) {
        BasePolicy = Word == "policy";
      } else if (Word == "group-feature" && Words >> Word) {
        auto It = std::find_if(Inputs.begin(), Inputs.end(),
                               [&](const TensorSpec &S) { return S.name() == Word; });
        if (It == Inputs.end() || !It->isElementType<int64_t>())
          Problem = "this compiler sends no int64 feature '" + Word + "'";
        else
          GroupIndex.push_back(static_cast<size_t>(It - Inputs.begin()));
      } else if (Word == "group") {
        std::vector<int64_t> Values;
        int64_t Value;
        while (Words >> Value) Values.push_back(Value);
        if (Values.size() != GroupIndex.size() + 1 || (Values.back() != 0 && Values.back() != 1))
          Problem = "a bad group line in the trajectory: " + Line;
        else {
          const int64_t Answer = Values.back();
          Values.pop_back();
          Groups[Values] = Answer;
        }
      } else if (Word == "flip") {
        size_t Index;
        if (Words >> Index) Flips.insert(Index);
        else Problem = "a bad flip line in the trajectory: " + Line;
      } else {
        Problem = "a bad line in the trajectory: " + Line;
      }
    }
  }
  void *evaluateUntyped() override {
    Log->startObservation();
    for (size_t I = 0; I + 1 < Specs.size(); ++I)
      Log->logTensorValue(I, static_cast<const char *>(getTensorUntyped(I)));
    Log->logTensorValue(Specs.size() - 1, reinterpret_cast<const char *>(&Default));
    Log->endObservation();
    const size_t Index = Next[Context]++;  // the observation's number, as the Logger's
    int64_t Answer = BasePolicy ? answer(false) : Default;
    if (!Groups.empty()) {
      std::vector<int64_t> Key;
      for (size_t I : GroupIndex) Key.push_back(*getTensor<int64_t>(I));
      auto It = Groups.find(Key);
      if (It != Groups.end()) Answer = It->second;
    }
    if (Flips.count(Index)) Answer = 1 - Answer;
    Answers.push_back(Answer ? '1' : '0');
    Advice = Answer;
    return &Advice;
  }
  std::vector<TensorSpec> Specs;  // the inputs, then LLVM's own decision
  std::unique_ptr<Logger> Log;
  std::string AnswersPath, Answers, Context;
  std::map<std::string, size_t> Next;  // per context, as the Logger numbers observations
  bool BasePolicy = false;
  std::vector<size_t> GroupIndex;
  std::map<std::vector<int64_t>, int64_t> Groups;
  std::set<size_t> Flips;
  int64_t Advice = 0;
};

// Tells mlgo-cc's size guard what this compile did (see mlgo.llvm.cmdline): MARK appended to
// the file kDeparturesEnv names, if it is one of the guard's (by its name) and exists.
void noteForGuard(char Mark) {
  const char *Path = getenv(kDeparturesEnv);
  const char *Name = Path ? strrchr(Path, '/') : nullptr;
  if (!Name || strncmp(Name + 1, kDeparturesPrefix, strlen(kDeparturesPrefix)) != 0) return;
  int Fd = open(Path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);  // never creates one
  if (Fd < 0) return;
  if (write(Fd, &Mark, 1) != 1) {  // unsaid: the guard compiles again, as without a mark
  }
  close(Fd);
}

// MLInlineAdvisor, with LLVM's own decision handed to the runner before each evaluation. A
// gated policy so knows whether it departed from it: it says so for the size guard, which
// needs no second compile of an object that is clang's own. A trajectory's runner
// (`Searching`) needs LLVM's decision at every evaluation, and no guard watches it.
class GatedAdvisor final : public MLInlineAdvisor {
 public:
  using MLInlineAdvisor::MLInlineAdvisor;
  ~GatedAdvisor() override {
    if (kGated && !Searching) noteForGuard(kAdvised);
  }
  PolicyRunner *Runner = nullptr;
  ProfileSummaryInfo *PSI = nullptr;
  bool Searching = false;

 protected:
  std::unique_ptr<MLInlineAdvice> getAdviceFromModel(CallBase &CB,
                                                     OptimizationRemarkEmitter &ORE) override {
    if (Runner->ReadsProfile) measureProfile(CB);
    if (!kGated && !Searching) return MLInlineAdvisor::getAdviceFromModel(CB, ORE);
    Runner->Default = GetDefaultAdvice(CB);
    auto Advice = MLInlineAdvisor::getAdviceFromModel(CB, ORE);
    if (Searching) return Advice;
    if (!Departed && Advice->isInliningRecommended() != static_cast<bool>(Runner->Default)) {
      Departed = true;
      noteForGuard(kDeparted);
    }
    return Advice;
  }

 private:
  // The call site's count and its callee's entry count by the profile (0 where it has none),
  // and the profile summary's verdict: 2 hot, 0 cold, 1 neither (or no summary).
  void measureProfile(CallBase &CB) {
    auto &BFI = FAM.getResult<BlockFrequencyAnalysis>(*CB.getCaller());
    const Function *Callee = CB.getCalledFunction();
    auto Entry = Callee ? Callee->getEntryCount() : std::nullopt;
    double *Out = Runner->Profile;
    Out[kCallSiteCount] = static_cast<double>(BFI.getBlockProfileCount(CB.getParent()).value_or(0));
    Out[kCalleeEntryCount] = Entry ? static_cast<double>(Entry->getCount()) : 0.0;
    Out[kCallSiteHotness] = PSI && PSI->isHotCallSite(CB, &BFI)    ? 2.0
                            : PSI && PSI->isColdCallSite(CB, &BFI) ? 0.0
                                                                   : 1.0;
  }
  bool Departed = false;
};

// Another advisor's advice, each non-mandatory one also written as a replay line: the
// lines of one advisor are appended to the file at its end, in one write. An inline at a
// callee clang would refuse (`refusal`) is answered "no" and its line marked kNotViable
// with clang's reason, so that no recorded build and no replay through here (`mlgo
// decisions check`) changes what the program means, and the writer can refuse the line.
class Recorder final : public InlineAdvisor {
 public:
  Recorder(Module &M, FunctionAnalysisManager &FAM, InlineContext IC,
           std::unique_ptr<InlineAdvisor> Inner, const char *Out)
      : InlineAdvisor(M, FAM, IC), Inner(std::move(Inner)), Out(Out) {}
  ~Recorder() override {
    int Fd = open(Out, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (Fd < 0 || write(Fd, Lines.data(), Lines.size()) != static_cast<ssize_t>(Lines.size()))
      errs() << "mlgo: cannot write the decisions to " << Out << "\n";
    if (Fd >= 0) close(Fd);
  }
  void onPassEntry(LazyCallGraph::SCC *SCC) override { Inner->onPassEntry(SCC); }
  void onPassExit(LazyCallGraph::SCC *SCC) override { Inner->onPassExit(SCC); }

 protected:
  std::unique_ptr<InlineAdvice> getAdviceImpl(CallBase &CB) override {
    auto Advice = Inner->getAdvice(CB, false);
    Function *Callee = CB.getCalledFunction();
    const char *Refused = nullptr;
    if (Callee && Advice->isInliningRecommended() && (Refused = refusal(CB, *Callee))) {
      Advice->recordUnattemptedInlining();  // clang's replay says "always" without asking
      Advice = std::make_unique<InlineAdvice>(this, CB, getCallerORE(CB), false);
    }
    std::string Key = formatCallSiteLocation(
        CB.getDebugLoc(), {CallSiteFormat::Format::LineColumnDiscriminator});
    if (Callee && !Key.empty())  // a site without a location cannot be replayed
      Lines += std::string(kDecisionsLinePrefix) + Callee->getName().str() +
               (Advice->isInliningRecommended() || Refused ? kInlinedInto : kNotInlinedInto) +
               CB.getCaller()->getName().str() + kAtCallsite + Key + ";" +
               (Refused ? std::string(kNotViable) + Refused : std::string()) + "\n";
    return Advice;
  }
  std::unique_ptr<InlineAdvice> getMandatoryAdvice(CallBase &CB, bool) override {
    return Inner->getAdvice(CB, true);  // replay never consults these: not recorded
  }

 private:
  // Why clang itself would never inline CALLEE at CB, or null: what its cost analysis checks
  // before any cost (the callee's viability: va_start, indirect branches, returns_twice
  // calls, llvm.localescape; then the attributes: noinline, optnone, target features and
  // sanitizers, ...). Inlining such a callee can change what the program means.
  const char *refusal(CallBase &CB, Function &Callee) {
    InlineResult Viable = isInlineViable(Callee);
    if (!Viable.isSuccess()) return Viable.getFailureReason();
    auto GetTLI = [this](Function &F) -> const TargetLibraryInfo & {
      return FAM.getResult<TargetLibraryAnalysis>(F);
    };
    auto ByAttributes = getAttributeBasedInliningDecision(
        CB, &Callee, FAM.getResult<TargetIRAnalysis>(Callee), GetTLI);
    return ByAttributes && !ByAttributes->isSuccess() ? ByAttributes->getFailureReason()
                                                      : nullptr;
  }
  std::unique_ptr<InlineAdvisor> Inner;
  const char *Out;
  std::string Lines;
};

// Whether clang was given -ir2vec-vocab-path: reading no vocabulary is an error in LLVM.
bool VocabularyGiven() {
  auto &Options = cl::getRegisteredOptions();
  auto It = Options.find("ir2vec-vocab-path");
  return It != Options.end() && It->second->getNumOccurrences() > 0;
}

// LLVM's own decision at a call site, for MLInlineAdvisor to ask where it asks for it.
std::function<bool(CallBase &)> clangsOwnAdvice(std::shared_ptr<DefaultInlineAdvisor> Default) {
  return [Default](CallBase &CB) {
    auto Advice = Default->getAdvice(CB);
    bool Inline = Advice->isInliningRecommended();
    Advice->recordUnattemptedInlining();
    return Inline;
  };
}

// MLInlineAdvisor answering from ANSWERS (a file `AnswersRunner` reads), else the default.
InlineAdvisor *makeAnswersAdvisor(Module &M, FunctionAnalysisManager &FAM, InlineParams Params,
                                  InlineContext IC, const char *Answers) {
  if (!CompilationMAM) return new DefaultInlineAdvisor(M, FAM, Params, IC);
  auto Default = std::make_shared<DefaultInlineAdvisor>(M, FAM, Params, IC);
  AnswersRunner *Runner = nullptr;
  auto Advisor = std::make_unique<MLInlineAdvisor>(
      M, *CompilationMAM,
      [&](const std::vector<TensorSpec> &Inputs) {
        auto R = std::make_unique<AnswersRunner>(M.getContext(), Inputs, Answers);
        Runner = R.get();
        return R;
      },
      clangsOwnAdvice(Default));  // asked where the channel's compile asks it
  if (Runner && Runner->Problem.empty()) return Advisor.release();
  errs() << "mlgo: " << (Runner ? Runner->Problem : std::string("no model runner"))
         << "; using the default heuristic\n";
  return new DefaultInlineAdvisor(M, FAM, Params, IC);
}

// The policy's advisor; with TRAJECTORY (a spec file `TrajectoryRunner` reads), a search's.
InlineAdvisor *makePolicyAdvisor(Module &M, FunctionAnalysisManager &FAM, InlineParams Params,
                                 InlineContext IC, const char *Trajectory = nullptr) {
  if (!CompilationMAM) return new DefaultInlineAdvisor(M, FAM, Params, IC);
  auto Default = std::make_shared<DefaultInlineAdvisor>(M, FAM, Params, IC);
  // LLVM's own advisor factories read IR2Vec's vocabulary first when asked to (it is what
  // makes MLInlineAdvisor send the embeddings); this one is made past them, so it reads it
  // for a policy that needs them, if clang was given one. Without it the embeddings stay
  // unsent, and the feature check below says so.
  if (kReadsEmbeddings && VocabularyGiven()) CompilationMAM->getResult<IR2VecVocabAnalysis>(M);
  PolicyRunner *Runner = nullptr;
  auto Advisor = std::make_unique<GatedAdvisor>(
      M, *CompilationMAM,
      [&](const std::vector<TensorSpec> &Inputs) -> std::unique_ptr<MLModelRunner> {
        auto R = Trajectory
                     ? std::make_unique<TrajectoryRunner>(M.getContext(), Inputs, Trajectory)
                     : std::make_unique<PolicyRunner>(M.getContext(), Inputs);
        Runner = R.get();
        return R;
      },
      clangsOwnAdvice(Default));
  Advisor->Runner = Runner;
  Advisor->Searching = Trajectory != nullptr;
  Advisor->PSI = &CompilationMAM->getResult<ProfileSummaryAnalysis>(M);
  if (Runner && Runner->Problem.empty()) return Advisor.release();
  errs() << "mlgo: feature layout mismatch: "
         << (Runner ? Runner->Problem : std::string("no model runner"))
         << "; using the default heuristic\n";
  return new DefaultInlineAdvisor(M, FAM, Params, IC);
}

// The policy's advisor, or with kDecisionsOutEnv set, the recorder around the advisor
// kDecisionsAdvisorEnv names.
InlineAdvisor *makeAdvisor(Module &M, FunctionAnalysisManager &FAM, InlineParams Params,
                           InlineContext IC) {
  const char *Trajectory = getenv(kTrajectoryEnv);
  if (Trajectory && *Trajectory) return makePolicyAdvisor(M, FAM, Params, IC, Trajectory);
  const char *Out = getenv(kDecisionsOutEnv);
  if (!Out || !*Out) return makePolicyAdvisor(M, FAM, Params, IC);
  const char *Whose = getenv(kDecisionsAdvisorEnv);
  const size_t Prefix = strlen(kReplayAdvisorPrefix);
  std::unique_ptr<InlineAdvisor> Inner;
  if (Whose && strcmp(Whose, kClangAdvisor) == 0) {
    Inner = std::make_unique<DefaultInlineAdvisor>(M, FAM, Params, IC);
  } else if (Whose && strncmp(Whose, kAnswersAdvisorPrefix, strlen(kAnswersAdvisorPrefix)) == 0) {
    Inner.reset(makeAnswersAdvisor(M, FAM, Params, IC, Whose + strlen(kAnswersAdvisorPrefix)));
  } else if (Whose && strncmp(Whose, kReplayAdvisorPrefix, Prefix) == 0) {
    ReplayInlinerSettings Replay{Whose + Prefix, ReplayInlinerSettings::Scope::Module,
                                 ReplayInlinerSettings::Fallback::Original,
                                 {CallSiteFormat::Format::LineColumnDiscriminator}};
    Inner = getReplayInlineAdvisor(M, FAM, M.getContext(),
                                   std::make_unique<DefaultInlineAdvisor>(M, FAM, Params, IC),
                                   Replay, false, IC);
  } else {
    Inner.reset(makePolicyAdvisor(M, FAM, Params, IC));
  }
  return new Recorder(M, FAM, IC, std::move(Inner), Out);
}

}  // namespace

extern "C" LLVM_ATTRIBUTE_WEAK LLVM_ATTRIBUTE_VISIBILITY_DEFAULT PassPluginLibraryInfo
llvmGetPassPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "mlgo-inliner", LLVM_VERSION_STRING, [](PassBuilder &PB) {
            PB.registerAnalysisRegistrationCallback([](ModuleAnalysisManager &MAM) {
              CompilationMAM = &MAM;
              MAM.registerPass([] { return PluginInlineAdvisorAnalysis(makeAdvisor); });
            });
          }};
}
