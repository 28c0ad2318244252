// The policy's constants, declared. mlgo/ship/plugin.py writes their definitions for each
// policy (policy_constants.cc, which includes this file, so that a type that differs is a
// compile error) and links them with inline_plugin.cc's object, which is built once per
// LLVM: a new policy costs a small compile and a link, not a compile against LLVM's headers.
#pragma once

extern const int kFeatures, kDerived, kLayers, kMaxWidth;
extern const char *const kFeatureNames[];
extern const int kFeatureElement[];  // 0 for a scalar; an element of IR2Vec's vectors
extern const bool kReadsEmbeddings;
// The names of the profile's inputs (mlgo.problems.profile_inputs), which the plugin computes.
extern const char *const kCallSiteCountName, *const kCalleeEntryCountName;
extern const char *const kCallSiteHotnessName;
extern const int kDerivedLeft[], kDerivedRight[];
extern const char kDerivedOp[];
extern const int kQuantileStart[];
extern const double kQuantiles[];
extern const int kLayerIn[], kLayerOut[];
extern const float kWeights[];  // per layer: W [in, out] row-major, then b
extern const bool kGated;        // see MLPPolicy.gate
extern const float kDepartureMargin;
extern const char *const kDeparturesEnv, *const kDeparturesPrefix;
extern const char kDeparted, kAdvised;
// The decisions recorder (mlgo.ship.decisions): its environment and its line's parts.
extern const char *const kDecisionsOutEnv, *const kDecisionsAdvisorEnv;
extern const char *const kClangAdvisor, *const kReplayAdvisorPrefix, *const kAnswersAdvisorPrefix;
extern const char *const kDecisionsLinePrefix, *const kInlinedInto, *const kNotInlinedInto;
extern const char *const kAtCallsite, *const kNotViable;
// A search's compile (TrajectoryRunner): its spec's path, and what it writes beside it.
extern const char *const kTrajectoryEnv, *const kTrajectoryLog, *const kTrajectoryAnswers;
