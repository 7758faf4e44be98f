// Host-side loops of the load balancer (torchrec_ascend/distributed/load_balance/): the LPT pass
// of the plan, and the byte packing / unpacking of the all_to_all buffers, each one call with
// plain loops and memcpy instead of one torch op per (field, peer).  The Python modules keep the
// reference implementations (used when this extension is absent) and the tests compare the two.
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <tuple>
#include <vector>

#include "torchrec_ascend.h"

namespace torchrec_ascend {

namespace {

int64_t pad_to(int64_t n, int64_t align) { return (n + align - 1) / align * align; }

void check_cpu_1d(const at::Tensor& t, at::ScalarType dt, const char* arg) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), arg, ": expected a CPU tensor, got ", t.device());
  TORCH_CHECK_VALUE(t.dim() == 1, arg, ": expected a 1-D tensor, got ", t.dim(), "-D");
  TORCH_CHECK_VALUE(t.scalar_type() == dt, arg, ": expected dtype ", dt, ", got ", t.scalar_type());
}

}  // namespace

// LPT: items by decreasing cost (ties: lower index first) to the bin with the least (cost, items,
// index) among bins with fewer than `cap` items (cap <= 0: no limit) and room for the item's size
// (sizes empty: no size limit).  Returns (bins int64 [N], failed item or -1): on a failure the
// caller reruns its reference to raise the error with its message.
std::tuple<at::Tensor, int64_t> lb_lpt(const at::Tensor& costs, int64_t num_bins, int64_t cap,
                                       const at::Tensor& sizes, double size_cap) {
  check_cpu_1d(costs, at::kDouble, "costs");
  TORCH_CHECK_VALUE(num_bins >= 1, "num_bins: must be >= 1, got ", num_bins);
  const auto c = costs.contiguous();
  const int64_t n = c.numel();
  const double* cp = c.data_ptr<double>();
  const bool sized = sizes.numel() > 0;
  at::Tensor s;
  const double* sp = nullptr;
  if (sized) {
    check_cpu_1d(sizes, at::kDouble, "sizes");
    TORCH_CHECK_VALUE(sizes.numel() == n, "sizes: has ", sizes.numel(), " entries, expected ", n);
    s = sizes.contiguous();
    sp = s.data_ptr<double>();
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [cp](int64_t a, int64_t b) { return cp[a] > cp[b]; });
  using Entry = std::tuple<double, int64_t, int64_t>;  // (cost, items, bin): heapq's order
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int64_t k = 0; k < num_bins; ++k) heap.emplace(0.0, 0, k);
  std::vector<double> used(num_bins, 0.0);
  auto bins = at::empty({n}, at::kLong);
  int64_t* bp = bins.data_ptr<int64_t>();
  std::vector<Entry> skipped;
  for (int64_t i : order) {
    skipped.clear();
    bool found = false;
    Entry e;
    while (!heap.empty()) {
      e = heap.top();
      heap.pop();
      if (sp != nullptr && used[std::get<2>(e)] + sp[i] > size_cap) {
        skipped.push_back(e);
        continue;
      }
      found = true;
      break;
    }
    if (!found) return {bins, i};
    const auto [load, cnt, k] = e;
    bp[i] = k;
    if (sp != nullptr) used[k] += sp[i];
    if (cap <= 0 || cnt + 1 < cap) heap.emplace(load + cp[i], cnt + 1, k);
    for (const auto& x : skipped) heap.push(x);
  }
  return {bins, -1};
}

// Refinement of a plan, in place on bins: the rules and tie-breaks of assign._refine_reference
// (the most expensive bin h; partners p in increasing cost (stable); the move of one item h -> p,
// or the swap of two, with the smallest max of the pair; first minimum in item order, moves
// before swaps on equal values), with `bound` the lower bound computed by the caller.
void lb_refine(const at::Tensor& costs, at::Tensor& bins, int64_t num_bins, int64_t cap,
               const at::Tensor& sizes, double size_cap, int64_t max_rounds, double tol, double bound,
               double rel_tol) {
  check_cpu_1d(costs, at::kDouble, "costs");
  check_cpu_1d(bins, at::kLong, "bins");
  TORCH_CHECK_VALUE(costs.is_contiguous() && bins.is_contiguous() && bins.numel() == costs.numel(),
                    "costs, bins: expected contiguous tensors of the same length");
  const int64_t n = costs.numel();
  const double* c = costs.data_ptr<double>();
  int64_t* b = bins.data_ptr<int64_t>();
  const double* s = nullptr;
  at::Tensor sc;
  if (sizes.numel() > 0) {
    check_cpu_1d(sizes, at::kDouble, "sizes");
    TORCH_CHECK_VALUE(sizes.numel() == n, "sizes: has ", sizes.numel(), " entries, expected ", n);
    sc = sizes.contiguous();
    s = sc.data_ptr<double>();
  }
  std::vector<double> loads(num_bins, 0.0), used(num_bins, 0.0);
  std::vector<int64_t> counts(num_bins, 0);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(b[i] >= 0 && b[i] < num_bins, "bins: entry ", i, " is outside [0, ", num_bins, ")");
    loads[b[i]] += c[i];
    counts[b[i]] += 1;
    if (s != nullptr) used[b[i]] += s[i];
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<int64_t> ih, ip, partners(num_bins);
  for (int64_t round = 0; round < max_rounds; ++round) {
    const int64_t h = std::max_element(loads.begin(), loads.end()) - loads.begin();
    const double lh = loads[h];
    if (lh <= bound * (1 + tol)) return;
    ih.clear();
    for (int64_t i = 0; i < n; ++i)
      if (b[i] == h) ih.push_back(i);
    std::iota(partners.begin(), partners.end(), 0);
    std::stable_sort(partners.begin(), partners.end(),
                     [&loads](int64_t x, int64_t y) { return loads[x] < loads[y]; });
    bool done = false;
    for (int64_t p : partners) {
      if (p == h || loads[p] >= lh) continue;
      const double lp = loads[p], uh = used[h], up = used[p];
      ip.clear();
      for (int64_t i = 0; i < n; ++i)
        if (b[i] == p) ip.push_back(i);
      bool have = false;
      double best = inf;
      int64_t bi = -1, bj = -1;
      if (cap <= 0 || counts[p] < cap) {  // moves h -> p
        double m = inf;
        int64_t arg = -1;
        for (int64_t a : ih) {
          double v = std::max(lh - c[a], lp + c[a]);
          if (s != nullptr && !(up + s[a] <= size_cap)) v = inf;
          if (arg < 0 || v < m) m = v, arg = a;
        }
        if (arg >= 0 && m < inf) have = true, best = m, bi = arg, bj = -1;
      }
      if (!ip.empty()) {
        double m = inf;
        int64_t aa = -1, ab = -1;
        for (int64_t a : ih)
          for (int64_t q : ip) {
            const double d = c[a] - c[q];
            double v = d > 0 ? std::max(lh - d, lp + d) : inf;
            if (s != nullptr) {
              const double ds = s[a] - s[q];
              if (!((up + ds <= size_cap) && (uh - ds <= size_cap))) v = inf;
            }
            if (aa < 0 || v < m) m = v, aa = a, ab = q;
          }
        if (aa >= 0 && m < inf && (!have || m < best)) have = true, best = m, bi = aa, bj = ab;
      }
      if (!have || best >= lh * (1 - rel_tol)) continue;
      const int64_t moves[2][3] = {{bi, h, p}, {bj, p, h}};
      for (const auto& mv : moves) {
        const int64_t item = mv[0], src = mv[1], dst = mv[2];
        if (item < 0) continue;
        b[item] = dst;
        loads[src] -= c[item];
        loads[dst] += c[item];
        counts[src] -= 1;
        counts[dst] += 1;
        if (s != nullptr) {
          used[src] -= s[item];
          used[dst] += s[item];
        }
      }
      done = true;
      break;
    }
    if (!done) return;
  }
}

// The send buffer of one exchange: per peer p, per field f, the rows of f for the local samples
// order[..] with dest == p (samples `order` grouped by destination; token fields: the token rows
// of those samples, group groups[f], in that order), each segment padded to `align` bytes.
// rows[f]: the field's local tensor (any dtype, contiguous, row_bytes[f] bytes a row); lengths:
// int64 [B, G] token counts of the local samples; dest: int64 [B] destination of each.
// Returns (buffer uint8, bytes per peer int64 [world]).
std::tuple<at::Tensor, at::Tensor> lb_pack(const std::vector<at::Tensor>& rows,
                                           const std::vector<int64_t>& groups,
                                           const std::vector<int64_t>& row_bytes,
                                           const at::Tensor& order, const at::Tensor& lengths,
                                           const at::Tensor& dest, int64_t world, int64_t align) {
  const int64_t F = static_cast<int64_t>(rows.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(groups.size()) == F && static_cast<int64_t>(row_bytes.size()) == F,
                    "groups, row_bytes: need one entry per field (", F, ")");
  TORCH_CHECK_VALUE(world >= 1 && align >= 1, "world, align: must be >= 1");
  check_cpu_1d(order, at::kLong, "order");
  check_cpu_1d(dest, at::kLong, "dest");
  TORCH_CHECK_VALUE(lengths.device().is_cpu() && lengths.dim() == 2 && lengths.scalar_type() == at::kLong,
                    "lengths: expected a CPU int64 [B, G] tensor");
  const int64_t B = order.numel();
  const int64_t G = lengths.size(1);
  TORCH_CHECK_VALUE(dest.numel() == B && lengths.size(0) == B, "order, dest, lengths: need ", B, " samples");
  const auto ord = order.contiguous(), dst = dest.contiguous(), len = lengths.contiguous();
  const int64_t* op = ord.data_ptr<int64_t>();
  const int64_t* dp = dst.data_ptr<int64_t>();
  const int64_t* lp = len.data_ptr<int64_t>();
  // token start of every local sample, per group
  std::vector<int64_t> start(B * G);
  std::vector<int64_t> total(G, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      start[b * G + g] = total[g];
      total[g] += lp[b * G + g];
    }
  std::vector<const uint8_t*> src(F);
  std::vector<at::Tensor> keep(F);
  for (int64_t f = 0; f < F; ++f) {
    const int64_t g = groups[f];
    TORCH_CHECK_VALUE(g >= -1 && g < G, "groups: entry ", f, " is ", g, ", expected -1 or a group < ", G);
    keep[f] = rows[f].contiguous();
    TORCH_CHECK_VALUE(keep[f].device().is_cpu(), "rows: field ", f, " is not on the CPU");
    const int64_t need = (g < 0 ? B : total[g]) * row_bytes[f];
    TORCH_CHECK_VALUE(keep[f].numel() * static_cast<int64_t>(keep[f].element_size()) == need, "rows: field ", f,
                      " has ", keep[f].numel() * keep[f].element_size(), " bytes, expected ", need);
    src[f] = static_cast<const uint8_t*>(keep[f].data_ptr());
  }
  // samples per peer: order is grouped by destination, ascending
  std::vector<int64_t> first(world + 1, 0);
  for (int64_t i = 0; i < B; ++i) {
    const int64_t p = dp[op[i]];
    TORCH_CHECK_VALUE(p >= 0 && p < world, "dest: entry ", op[i], " is ", p, ", outside [0, ", world, ")");
    TORCH_CHECK_VALUE(i == 0 || dp[op[i - 1]] <= p, "order: not grouped by ascending destination");
    first[p + 1] = i + 1;
  }
  for (int64_t p = 1; p <= world; ++p) first[p] = std::max(first[p], first[p - 1]);
  // bytes per (peer, field)
  auto per_peer = at::zeros({world}, at::kLong);
  int64_t* pp = per_peer.data_ptr<int64_t>();
  std::vector<int64_t> seg(world * F);
  int64_t size = 0;
  for (int64_t p = 0; p < world; ++p) {
    for (int64_t f = 0; f < F; ++f) {
      int64_t n = 0;
      if (groups[f] < 0) {
        n = first[p + 1] - first[p];
      } else {
        for (int64_t i = first[p]; i < first[p + 1]; ++i) n += lp[op[i] * G + groups[f]];
      }
      seg[p * F + f] = n * row_bytes[f];
      pp[p] += pad_to(seg[p * F + f], align);
    }
    size += pp[p];
  }
  auto buf = at::empty({size}, at::kByte);
  uint8_t* out = buf.data_ptr<uint8_t>();
  int64_t pos = 0;
  for (int64_t p = 0; p < world; ++p) {
    for (int64_t f = 0; f < F; ++f) {
      const int64_t rb = row_bytes[f], g = groups[f];
      uint8_t* w = out + pos;
      for (int64_t i = first[p]; i < first[p + 1]; ++i) {
        const int64_t b = op[i];
        if (g < 0) {
          std::memcpy(w, src[f] + b * rb, rb);
          w += rb;
        } else {
          const int64_t nb = lp[b * G + g] * rb;
          std::memcpy(w, src[f] + start[b * G + g] * rb, nb);
          w += nb;
        }
      }
      const int64_t padded = pad_to(seg[p * F + f], align);
      std::memset(w, 0, padded - seg[p * F + f]);
      pos += padded;
    }
  }
  return {buf, per_peer};
}

// Inverse of lb_pack on the receiving side: counts int64 [F, world] rows of every field from every
// peer; returns one uint8 tensor per field with its rows, peers in order.
std::vector<at::Tensor> lb_unpack(const at::Tensor& buf, const std::vector<int64_t>& row_bytes,
                                  const at::Tensor& counts, int64_t align) {
  check_cpu_1d(buf, at::kByte, "buf");
  const int64_t F = static_cast<int64_t>(row_bytes.size());
  TORCH_CHECK_VALUE(counts.device().is_cpu() && counts.dim() == 2 && counts.scalar_type() == at::kLong &&
                        counts.size(0) == F,
                    "counts: expected a CPU int64 [", F, ", world] tensor");
  const int64_t world = counts.size(1);
  const auto cnt = counts.contiguous();
  const int64_t* cp = cnt.data_ptr<int64_t>();
  std::vector<at::Tensor> out(F);
  std::vector<uint8_t*> w(F);
  int64_t need = 0;
  for (int64_t f = 0; f < F; ++f) {
    int64_t n = 0;
    for (int64_t p = 0; p < world; ++p) {
      n += cp[f * world + p];
      need += pad_to(cp[f * world + p] * row_bytes[f], align);
    }
    out[f] = at::empty({n * row_bytes[f]}, at::kByte);
    w[f] = out[f].data_ptr<uint8_t>();
  }
  TORCH_CHECK_VALUE(buf.numel() == need, "buf: has ", buf.numel(), " bytes, the layout needs ", need);
  const auto b = buf.contiguous();
  const uint8_t* in = b.data_ptr<uint8_t>();
  int64_t pos = 0;
  for (int64_t p = 0; p < world; ++p)
    for (int64_t f = 0; f < F; ++f) {
      const int64_t nb = cp[f * world + p] * row_bytes[f];
      std::memcpy(w[f], in + pos, nb);
      w[f] += nb;
      pos += pad_to(nb, align);
    }
  return out;
}

// out row index[i] = src row i (row_bytes bytes a row); index a permutation of [0, n).
at::Tensor lb_scatter_rows(const at::Tensor& src, const at::Tensor& index, int64_t row_bytes) {
  check_cpu_1d(src, at::kByte, "src");
  check_cpu_1d(index, at::kLong, "index");
  const int64_t n = index.numel();
  TORCH_CHECK_VALUE(row_bytes >= 0 && src.numel() == n * row_bytes, "src: has ", src.numel(),
                    " bytes, expected ", n, " rows x ", row_bytes);
  const auto s = src.contiguous(), ix = index.contiguous();
  const uint8_t* in = s.data_ptr<uint8_t>();
  const int64_t* ip = ix.data_ptr<int64_t>();
  auto out = at::empty({n * row_bytes}, at::kByte);
  uint8_t* o = out.data_ptr<uint8_t>();
  std::vector<char> seen(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = ip[i];
    TORCH_CHECK_VALUE(j >= 0 && j < n && !seen[j], "index: must be a permutation of [0, ", n, ")");
    seen[j] = 1;
    std::memcpy(o + j * row_bytes, in + i * row_bytes, row_bytes);
  }
  return out;
}

void bind_load_balance(pybind11::module& m) {
  m.def("lb_lpt", &lb_lpt);
  m.def("lb_refine", &lb_refine);
  m.def("lb_pack", &lb_pack);
  m.def("lb_unpack", &lb_unpack);
  m.def("lb_scatter_rows", &lb_scatter_rows);
}

}  // namespace torchrec_ascend
