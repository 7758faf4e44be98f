// Which engine runs the HSTU attention of each dtype on this CPU: measured once per process.
//
// fp32: avx512_fp32, avx2_fp32 or blas; bf16: amx_bf16, avx512_bf16 or "fp32" (inputs widened,
// the fp32 engine runs).  The usable candidates (hstu::engine_usable) each run one fixed problem, forward
// and backward, three rounds interleaved after a warm-up; the lowest median wins.  The choice
// and the times behind it are reported (hstu_choice_report); tests and benchmarks can force one.
#include "hstu_choice.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "interleaved_timing.h"
#include "isa.h"

namespace torchrec_ascend {
namespace hstu {

namespace {

struct State {
  std::mutex mu;
  bool chosen[2] = {false, false};
  Choice choice[2];
};
State& state() {
  static State s;
  return s;
}
int slot(Dtype d) { return d == Dtype::kFloat ? 0 : 1; }

// The probe: 4 sequences of 192 tokens (one full-length), 2 heads, d = 64, position and time
// bias, forward + backward; a few milliseconds on the fast engines.
struct Probe {
  static constexpr int64_t kB = 4, kN = 192, kH = 2, kD = 64;
  std::vector<int64_t> off, ts;
  std::vector<float> pos, tsw, f32[4];   // q, k, v, grad
  std::vector<bf16_t> b16[4];
  std::vector<float> of32, dq, dk, dv;
  std::vector<bf16_t> ob16, bq, bk, bv;
  std::vector<double> gp, gt;
  Bucketer bucketer{128};
  Problem<float> P;

  Probe() {
    std::mt19937 rng(0);
    std::normal_distribution<float> nd(0.0f, 0.5f);
    off.resize(kB + 1);
    for (int64_t b = 0; b <= kB; ++b) off[b] = b * kN;
    const int64_t T = kB * kN;
    ts.resize(T);
    int64_t t = 0;
    for (auto& x : ts) x = (t += 1 + static_cast<int64_t>(rng() % 100000));
    pos.resize(2 * kN - 1);
    tsw.resize(129);
    for (auto& x : pos) x = 0.1f * nd(rng);
    for (auto& x : tsw) x = 0.1f * nd(rng);
    for (int i = 0; i < 4; ++i) {
      f32[i].resize(T * kH * kD);
      b16[i].resize(T * kH * kD);
      for (size_t x = 0; x < f32[i].size(); ++x) {
        f32[i][x] = nd(rng);
        uint32_t u;
        std::memcpy(&u, &f32[i][x], 4);
        b16[i][x] = static_cast<bf16_t>(u >> 16);
      }
    }
    of32.resize(T * kH * kD); dq = dk = dv = of32;
    ob16.resize(T * kH * kD); bq = bk = bv = ob16;
    gp.resize(pos.size()); gt.resize(tsw.size());
    P.B = kB; P.H = kH; P.dqk = P.dv = kD; P.max_seq_len = kN; P.alpha = 0.125;
    P.off = off.data(); P.ts = ts.data(); P.pos_w = pos.data(); P.ts_w = tsw.data(); P.nts = 129;
    P.bucketer = &bucketer;
  }

  // one forward + backward with `e` (the fp32 engines on fp32, the bf16 engines on bf16)
  void run(Engine e) {
    std::fill(gp.begin(), gp.end(), 0.0);
    std::fill(gt.begin(), gt.end(), 0.0);
    if (e == Engine::kAmxBf16 || e == Engine::kAvx512Bf16) {
      forward(e, P, b16[0].data(), b16[1].data(), b16[2].data(), ob16.data());
      backward(e, P, b16[3].data(), b16[0].data(), b16[1].data(), b16[2].data(), bq.data(), bk.data(), bv.data(),
               gp.data(), gt.data());
    } else {
      forward(e, P, f32[0].data(), f32[1].data(), f32[2].data(), of32.data());
      backward(e, P, f32[3].data(), f32[0].data(), f32[1].data(), f32[2].data(), dq.data(), dk.data(), dv.data(),
               gp.data(), gt.data());
    }
  }
};

// Every candidate of each dtype, in the order they are tried and listed; the bf16 "fp32"
// candidate runs the fp32 choice (and widening costs a little on top, which the probe does not
// charge: a near tie goes to it anyway).
struct Candidate {
  const char* name;
  Dtype dtype;
  Engine engine;  // for "fp32": replaced by the fp32 choice at use
  bool widen;
};
constexpr Candidate kCandidates[] = {
    {"avx512_fp32", Dtype::kFloat, Engine::kAvx512F32, false},
    {"avx2_fp32", Dtype::kFloat, Engine::kAvx2F32, false},
    {"blas", Dtype::kFloat, Engine::kBlas, false},
    {"amx_bf16", Dtype::kBFloat16, Engine::kAmxBf16, false},
    {"avx512_bf16", Dtype::kBFloat16, Engine::kAvx512Bf16, false},
    {"fp32", Dtype::kBFloat16, Engine::kBlas, true},
};

// the candidates of `d` that run on this CPU (the widened one always does)
std::vector<Candidate> usable(Dtype d) {
  std::vector<Candidate> out;
  for (const Candidate& c : kCandidates)
    if (c.dtype == d && (c.widen || engine_usable(c.engine))) out.push_back(c);
  return out;
}

// "float32: avx512_fp32, avx2_fp32, blas; bfloat16: amx_bf16, avx512_bf16, fp32"
std::string all_names() {
  std::string out;
  for (Dtype d : {Dtype::kFloat, Dtype::kBFloat16}) {
    out += out.empty() ? "float32: " : "; bfloat16: ";
    bool first = true;
    for (const Candidate& c : kCandidates)
      if (c.dtype == d) {
        out += (first ? "" : ", ") + std::string(c.name);
        first = false;
      }
  }
  return out;
}

Choice measure(Dtype d, const Choice* fp32) {
  std::vector<Candidate> cands = usable(d);
  for (Candidate& c : cands)
    if (c.widen) c.engine = fp32->engine;
  Choice c;
  if (cands.size() == 1) {
    c.engine = cands[0].engine;
    c.widen = cands[0].widen;
    c.name = cands[0].name;
    c.reason = "only candidate on this CPU";
    return c;
  }
  Probe probe;
  const std::vector<double> med =
      interleaved_median_seconds(cands.size(), 3, [&](size_t i) { probe.run(cands[i].engine); });
  const size_t best = index_of_min(med);
  c.engine = cands[best].engine;
  c.widen = cands[best].widen;
  c.name = cands[best].name;
  std::string why = "measured fwd+bwd ms:";
  for (size_t i = 0; i < cands.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %s %.2f", cands[i].name, med[i] * 1e3);
    why += buf;
  }
  c.reason = why;
  return c;
}

}  // namespace

Choice chosen_engine(Dtype d) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // a choice goes stale when its engine stops being usable (tests cap the ISA: csrc/isa.h)
  auto stale = [&](int i) { return !s.chosen[i] || (!s.choice[i].widen && !engine_usable(s.choice[i].engine)); };
  if (stale(0)) {  // fp32: also what widened bf16 runs on
    s.choice[0] = measure(Dtype::kFloat, nullptr);
    s.chosen[0] = true;
  }
  const int i = slot(d);
  if (i == 1 && stale(1)) {
    s.choice[1] = measure(d, &s.choice[0]);
    s.chosen[1] = true;
  }
  Choice c = s.choice[i];
  if (c.widen) c.engine = s.choice[0].engine;
  return c;
}

void force_engine(Dtype d, const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const int i = slot(d);
  if (name.empty()) {  // measure again on next use
    s.chosen[i] = false;
    return;
  }
  const Candidate* found = nullptr;
  for (const Candidate& cand : kCandidates)
    if (cand.dtype == d && name == cand.name) found = &cand;
  if (found == nullptr)
    throw std::invalid_argument("hstu engine: '" + name + "' is not an engine of this dtype (" + all_names() + ")");
  Choice c;
  c.name = name;
  c.reason = "forced";
  c.engine = found->engine;
  c.widen = found->widen;
  if (!c.widen && !engine_usable(c.engine))
    throw std::invalid_argument("hstu engine: '" + name + "' does not run on this CPU");
  s.choice[i] = c;
  s.chosen[i] = true;
}

std::vector<std::string> usable_engines(Dtype d) {
  std::vector<std::string> out;
  for (const Candidate& c : usable(d)) out.push_back(c.name);
  return out;
}

}  // namespace hstu
}  // namespace torchrec_ascend
