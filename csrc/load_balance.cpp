// Host-side loops of the load balancer (torchrec_ascend/distributed/load_balance/): the LPT pass
// of the plan, the exchange plan with the byte packing of the all_to_all buffer (one call), and the
// unpacking / restore scatter, each with plain loops and memcpy instead of one torch op per (field,
// peer).  The Python modules keep the reference implementations (used when this extension is
// absent) and the tests compare the two.
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

// The exchange of one balanced batch for rank `rank`, in one call: the send order, the rows and
// bytes per peer (sent and received), the global samples received and their lengths, and the send
// buffer.  rows: int64 [N, 1 + G] of the global batch (column 0 unused here, then the token count of
// every jagged group), rank r's samples at [sum(counts[:r]), sum(counts[:r + 1])); counts: int64
// [world]; bins: int64 [N] destination rank of every global sample.  tensors[f]: this rank's local
// tensor of field f (contiguous bytes, row_bytes[f] a row), sample rows (groups[f] = -1) or the token
// rows of jagged group groups[f].  Buffer layout: per peer p, per field f, the rows of f for the
// local samples sent to p (in local index order; token fields: those samples' token rows), each
// segment zero-padded to `align` bytes.  Returns (buffer uint8, table int64 [2, 2 + G, world] =
// (send, recv) x (bytes, samples, tokens of group 0..G-1) per peer, order int64 [B] (local indices
// grouped by destination, ascending: a stable sort), recv_global int64 [B'] (ascending),
// recv_lengths int64 [G, B']).  The Python reference is packing._plan_pack_reference.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lb_exchange_pack(
    const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& bins, int64_t rank,
    const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& groups,
    const std::vector<int64_t>& row_bytes, int64_t align) {
  const int64_t F = static_cast<int64_t>(tensors.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(groups.size()) == F && static_cast<int64_t>(row_bytes.size()) == F,
                    "groups, row_bytes: need one entry per field (", F, ")");
  TORCH_CHECK_VALUE(align >= 1, "align: must be >= 1, got ", align);
  check_cpu_1d(counts, at::kLong, "counts");
  check_cpu_1d(bins, at::kLong, "bins");
  TORCH_CHECK_VALUE(rows.device().is_cpu() && rows.dim() == 2 && rows.scalar_type() == at::kLong && rows.size(1) >= 1,
                    "rows: expected a CPU int64 [N, 1 + G] tensor");
  const int64_t world = counts.numel();
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, "rank: ", rank, " is outside [0, ", world, ")");
  const int64_t N = rows.size(0), W = rows.size(1), G = W - 1;
  TORCH_CHECK_VALUE(bins.numel() == N, "bins: has ", bins.numel(), " entries, rows has ", N);
  const auto cnt_c = counts.contiguous(), bins_c = bins.contiguous(), rows_c = rows.contiguous();
  const int64_t* cp = cnt_c.data_ptr<int64_t>();
  const int64_t* bp = bins_c.data_ptr<int64_t>();
  const int64_t* rp = rows_c.data_ptr<int64_t>();
  std::vector<int64_t> owner(N);
  int64_t start = 0, total = 0;
  for (int64_t r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(cp[r] >= 0, "counts: entry ", r, " is negative");
    if (r == rank) start = total;
    for (int64_t i = total; i < std::min(N, total + cp[r]); ++i) owner[i] = r;
    total += cp[r];
  }
  TORCH_CHECK_VALUE(total == N, "counts: sum to ", total, ", rows has ", N);
  for (int64_t i = 0; i < N; ++i) {
    TORCH_CHECK_VALUE(bp[i] >= 0 && bp[i] < world, "bins: entry ", i, " is ", bp[i], ", outside [0, ", world, ")");
    for (int64_t g = 0; g < G; ++g)
      TORCH_CHECK_VALUE(rp[i * W + 1 + g] >= 0, "rows: sample ", i, " has a negative length");
  }
  const int64_t B = cp[rank];
  const int64_t* local = bp + start;            // destination of every local sample
  const int64_t* lrows = rp + start * W;        // local rows
  // table: [2][2 + G][world]
  const int64_t K = 2 + G;
  auto table = at::zeros({2, K, world}, at::kLong);
  int64_t* tp = table.data_ptr<int64_t>();
  int64_t* send = tp;
  int64_t* recv = tp + K * world;
  // order: counting sort of the local samples by destination (stable)
  for (int64_t b = 0; b < B; ++b) {
    send[1 * world + local[b]] += 1;
    for (int64_t g = 0; g < G; ++g) send[(2 + g) * world + local[b]] += lrows[b * W + 1 + g];
  }
  auto order = at::empty({B}, at::kLong);
  int64_t* op = order.data_ptr<int64_t>();
  {
    std::vector<int64_t> next(world, 0);
    for (int64_t p = 1; p < world; ++p) next[p] = next[p - 1] + send[world + p - 1];
    for (int64_t b = 0; b < B; ++b) op[next[local[b]]++] = b;
  }
  int64_t Bp = 0;
  for (int64_t i = 0; i < N; ++i) Bp += bp[i] == rank;
  auto recv_global = at::empty({Bp}, at::kLong);
  auto recv_lengths = at::empty({G, Bp}, at::kLong);
  int64_t* gp = recv_global.data_ptr<int64_t>();
  int64_t* lp = recv_lengths.data_ptr<int64_t>();
  for (int64_t i = 0, k = 0; i < N; ++i) {
    if (bp[i] != rank) continue;
    gp[k] = i;
    recv[1 * world + owner[i]] += 1;
    for (int64_t g = 0; g < G; ++g) {
      lp[g * Bp + k] = rp[i * W + 1 + g];
      recv[(2 + g) * world + owner[i]] += rp[i * W + 1 + g];
    }
    ++k;
  }
  // the local tensors and their token starts
  std::vector<int64_t> tok_start(B * G), tok_total(G, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      tok_start[b * G + g] = tok_total[g];
      tok_total[g] += lrows[b * W + 1 + g];
    }
  std::vector<at::Tensor> keep(F);
  std::vector<const uint8_t*> src(F);
  for (int64_t f = 0; f < F; ++f) {
    const int64_t g = groups[f];
    TORCH_CHECK_VALUE(g >= -1 && g < G, "groups: entry ", f, " is ", g, ", expected -1 or a group < ", G);
    TORCH_CHECK_VALUE(row_bytes[f] >= 0, "row_bytes: entry ", f, " is negative");
    keep[f] = tensors[f].contiguous();
    TORCH_CHECK_VALUE(keep[f].device().is_cpu(), "tensors: field ", f, " is not on the CPU");
    const int64_t have = keep[f].numel() * static_cast<int64_t>(keep[f].element_size());
    const int64_t need = (g < 0 ? B : tok_total[g]) * row_bytes[f];
    TORCH_CHECK_VALUE(have == need, "tensors: field ", f, " has ", have, " bytes, expected ", need);
    src[f] = static_cast<const uint8_t*>(keep[f].data_ptr());
  }
  // bytes per peer, both ways
  for (int64_t p = 0; p < world; ++p)
    for (int64_t f = 0; f < F; ++f) {
      const int64_t kind = 2 + groups[f];  // 1: samples, 2 + g: tokens of group g
      send[p] += pad_to(send[kind * world + p] * row_bytes[f], align);
      recv[p] += pad_to(recv[kind * world + p] * row_bytes[f], align);
    }
  int64_t size = 0;
  for (int64_t p = 0; p < world; ++p) size += send[p];
  auto buf = at::empty({size}, at::kByte);
  uint8_t* out = buf.data_ptr<uint8_t>();
  int64_t first = 0;
  for (int64_t p = 0; p < world; ++p) {
    const int64_t last = first + send[world + p];
    for (int64_t f = 0; f < F; ++f) {
      const int64_t rb = row_bytes[f], g = groups[f];
      uint8_t* w = out;
      for (int64_t i = first; i < last; ++i) {
        const int64_t b = op[i];
        if (g < 0) {
          std::memcpy(w, src[f] + b * rb, rb);
          w += rb;
        } else {
          const int64_t nb = lrows[b * W + 1 + g] * rb;
          std::memcpy(w, src[f] + tok_start[b * G + g] * rb, nb);
          w += nb;
        }
      }
      const int64_t used = w - out, padded = pad_to(used, align);
      std::memset(w, 0, padded - used);
      out += padded;
    }
    first = last;
  }
  return {buf, table, order, recv_global, recv_lengths};
}

// Inverse of lb_exchange_pack on the receiving side: rows int64 [K, world] rows of every kind from
// every peer, kinds[f] field f's row of it (packing.unpack passes the recv half of lb_exchange_pack's
// table and kinds[f] = 2 + groups[f]); like[f] a tensor of field f's dtype and trailing shape (any
// first dimension).  Returns one tensor per field (like[f]'s dtype, [rows, *trailing]), peers in
// order.
std::vector<at::Tensor> lb_unpack(const at::Tensor& buf, const std::vector<at::Tensor>& like,
                                  const std::vector<int64_t>& kinds, const at::Tensor& rows, int64_t align) {
  check_cpu_1d(buf, at::kByte, "buf");
  const int64_t F = static_cast<int64_t>(like.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(kinds.size()) == F, "kinds: need one entry per field (", F, ")");
  TORCH_CHECK_VALUE(align >= 1, "align: must be >= 1, got ", align);
  TORCH_CHECK_VALUE(rows.device().is_cpu() && rows.dim() == 2 && rows.scalar_type() == at::kLong,
                    "rows: expected a CPU int64 [kinds, world] tensor");
  const int64_t K = rows.size(0), world = rows.size(1);
  const auto cnt = rows.contiguous();
  const int64_t* cp = cnt.data_ptr<int64_t>();
  std::vector<at::Tensor> out(F);
  std::vector<uint8_t*> w(F);
  std::vector<int64_t> rb(F);
  int64_t need = 0;
  for (int64_t f = 0; f < F; ++f) {
    TORCH_CHECK_VALUE(kinds[f] >= 0 && kinds[f] < K, "kinds: entry ", f, " is ", kinds[f], ", outside [0, ", K, ")");
    TORCH_CHECK_VALUE(like[f].dim() >= 1, "like: field ", f, " has no first dimension");
    const int64_t* c = cp + kinds[f] * world;
    int64_t n = 0;
    rb[f] = like[f].element_size();
    for (int64_t d = 1; d < like[f].dim(); ++d) rb[f] *= like[f].size(d);
    for (int64_t p = 0; p < world; ++p) {
      TORCH_CHECK_VALUE(c[p] >= 0, "rows: negative count");
      n += c[p];
      need += pad_to(c[p] * rb[f], align);
    }
    auto sizes = like[f].sizes().vec();
    sizes[0] = n;
    out[f] = at::empty(sizes, like[f].options().device(at::kCPU));
    w[f] = static_cast<uint8_t*>(out[f].data_ptr());
  }
  TORCH_CHECK_VALUE(buf.numel() == need, "buf: has ", buf.numel(), " bytes, the layout needs ", need);
  const auto b = buf.contiguous();
  const uint8_t* in = b.data_ptr<uint8_t>();
  int64_t pos = 0;
  for (int64_t p = 0; p < world; ++p)
    for (int64_t f = 0; f < F; ++f) {
      const int64_t nb = cp[kinds[f] * world + p] * rb[f];
      if (nb) std::memcpy(w[f], in + pos, nb);
      w[f] += nb;
      pos += pad_to(nb, align);
    }
  return out;
}

// out row index[i] = src row i, with src the bytes of n rows like `like` (its dtype and trailing
// shape); index a permutation of [0, n).  Returns [n, *trailing] of like's dtype.
at::Tensor lb_scatter_rows(const at::Tensor& src, const at::Tensor& index, const at::Tensor& like) {
  check_cpu_1d(src, at::kByte, "src");
  check_cpu_1d(index, at::kLong, "index");
  TORCH_CHECK_VALUE(like.dim() >= 1, "like: needs a first dimension");
  const int64_t n = index.numel();
  int64_t row_bytes = like.element_size();
  for (int64_t d = 1; d < like.dim(); ++d) row_bytes *= like.size(d);
  TORCH_CHECK_VALUE(src.numel() == n * row_bytes, "src: has ", src.numel(), " bytes, expected ", n, " rows x ",
                    row_bytes);
  const auto s = src.contiguous(), ix = index.contiguous();
  const uint8_t* in = s.data_ptr<uint8_t>();
  const int64_t* ip = ix.data_ptr<int64_t>();
  auto sizes = like.sizes().vec();
  sizes[0] = n;
  auto out = at::empty(sizes, like.options().device(at::kCPU));
  uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
  std::vector<char> seen(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = ip[i];
    TORCH_CHECK_VALUE(j >= 0 && j < n && !seen[j], "index: must be a permutation of [0, ", n, ")");
    seen[j] = 1;
    if (row_bytes) std::memcpy(o + j * row_bytes, in + i * row_bytes, row_bytes);
  }
  return out;
}

void bind_load_balance(pybind11::module& m) {
  m.def("lb_lpt", &lb_lpt);
  m.def("lb_refine", &lb_refine);
  m.def("lb_exchange_pack", &lb_exchange_pack);
  m.def("lb_unpack", &lb_unpack);
  m.def("lb_scatter_rows", &lb_scatter_rows);
}

}  // namespace torchrec_ascend
