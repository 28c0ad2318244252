#include <cstdio>
#include <string>
#include <vector>

#include "stats.h"

static std::vector<double> parse(int argc, char **argv) {
  std::vector<double> xs;
  for (int i = 1; i < argc; i++) xs.push_back(std::stod(argv[i]));
  return xs;
}

int main(int argc, char **argv) {
  std::vector<double> xs = parse(argc, argv);
  int n = static_cast<int>(xs.size());
  std::printf("mean %g var %g\n", stats_mean(xs.data(), n), stats_var(xs.data(), n));
  return 0;
}
