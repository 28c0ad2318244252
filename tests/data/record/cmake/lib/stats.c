#include "stats.h"

static double sum(const double *xs, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += xs[i];
  return s;
}

double stats_mean(const double *xs, int n) { return n ? sum(xs, n) / n : 0; }

double stats_var(const double *xs, int n) {
  double m = stats_mean(xs, n), s = 0;
  for (int i = 0; i < n; i++) s += (xs[i] - m) * (xs[i] - m);
  return n ? s / n : 0;
}
