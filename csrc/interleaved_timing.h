// Choosing a kernel variant by measuring it on this CPU, once: the candidates timed in turn.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace torchrec_ascend {

// The median seconds of each of n candidates: run(i) runs candidate i; one warm-up round, then
// `rounds` timed rounds, the candidates in turn and the order reversed every other round (none
// always runs first, after the same neighbour).
template <class Run>
std::vector<double> interleaved_median_seconds(size_t n, int rounds, Run run) {
  std::vector<std::vector<double>> times(n);
  for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
    for (size_t x = 0; x < n; ++x) {
      const size_t i = round % 2 ? n - 1 - x : x;
      const auto t0 = std::chrono::steady_clock::now();
      run(i);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) times[i].push_back(t);
    }
  }
  std::vector<double> med(n);
  for (size_t i = 0; i < n; ++i) {
    std::sort(times[i].begin(), times[i].end());
    med[i] = times[i][times[i].size() / 2];
  }
  return med;
}

// The next of a fixed pseudo-random sequence (xorshift64; `state` nonzero): the candidates'
// inputs, the same on every run.
inline uint64_t next_fixed_random(uint64_t& state) {
  state ^= state << 13, state ^= state >> 7, state ^= state << 17;
  return state;
}

// The index of the smallest entry (the first of equals).
inline size_t index_of_min(const std::vector<double>& v) {
  return static_cast<size_t>(std::min_element(v.begin(), v.end()) - v.begin());
}

}  // namespace torchrec_ascend
