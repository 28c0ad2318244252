#ifndef STATS_H
#define STATS_H
#ifdef __cplusplus
extern "C" {
#endif
double stats_mean(const double *xs, int n);
double stats_var(const double *xs, int n);
#ifdef __cplusplus
}
#endif
#endif
