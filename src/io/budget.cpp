// io/budget.hpp: the exact multiple-choice knapsack behind --budget, the error estimate and the CSV.
//
// The chooser is a dynamic program over the layers that keeps, after each layer, the partial
// assignments that can still lead to the optimum: a state (bits, error) is dropped when another
// state beats it in every completion (at most its bits and its error, see `sweep`), when even the
// cheapest completion exceeds the budget, or when a lower bound on its completions' error
// (Lagrangian relaxation) exceeds the error of a feasible assignment found greedily. Capacities
// reach 1e10 bits and more, so nothing is indexed by capacity.
#include "io/budget.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "cpu/dense.hpp"
#include "cpu/parallel.hpp"
#include "io/detail.hpp"
#include "microscale/dtype.hpp"

namespace microscale::io::ck {
namespace {

constexpr std::int64_t kMaxInt64 = std::numeric_limits<std::int64_t>::max();

std::string shortest(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

std::string g17(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Bits and weights are counted below these, so that sums of them and products with a budget stay
// exact where they need to be.
constexpr std::int64_t kMaxBits = std::int64_t{1} << 61, kMaxWeights = std::int64_t{1} << 53;

// min(floor(bits_per_weight * numel), limit), exactly: numel (< 2^53) is a double, and fma gives
// the product's rounding error exactly. limit <= kMaxBits.
std::int64_t capacity(double bits_per_weight, std::int64_t numel, std::int64_t limit) {
  const double n = static_cast<double>(numel);
  const double p = bits_per_weight * n;
  if (p >= 2.0 * static_cast<double>(kMaxBits)) return limit;  // the product is above kMaxBits
  const double r = std::fma(bits_per_weight, n, -p);           // bits_per_weight * n == p + r
  const double f = std::floor(p);
  // A fractional p is below 2^52, where |r| < ulp(p) / 2 cannot cross an integer.
  const std::int64_t floor =
      f != p ? static_cast<std::int64_t>(f) : static_cast<std::int64_t>(p) + static_cast<std::int64_t>(std::floor(r));
  return std::min(floor, limit);
}

// The smallest budget printed with 6 decimals that `min_bits` fits (for the infeasible message).
std::string min_budget_text(std::int64_t min_bits, std::int64_t numel) {
  double v = std::ceil(static_cast<double>(min_bits) / static_cast<double>(numel) * 1e6) / 1e6;
  while (capacity(v, numel, kMaxBits) < min_bits) v = (std::round(v * 1e6) + 1) / 1e6;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

void check_layers(std::span<const BudgetLayer> layers, double bits_per_weight) {
  if (!(bits_per_weight > 0) || !std::isfinite(bits_per_weight))
    throw Error("--budget must be a positive number of bits per weight, got " + shortest(bits_per_weight));
  if (layers.empty()) throw Error("--budget: no layers to choose formats for");
  for (const BudgetLayer& l : layers) {
    const std::string at = "--budget: tensor " + detail::quote(l.tensor);
    if (l.numel < 1) throw Error(at + " has " + std::to_string(l.numel) + " weights");
    if (l.options.empty()) throw Error(at + " has no candidate formats");
    if (l.options.size() > std::numeric_limits<std::uint32_t>::max()) throw Error(at + " has too many candidates");
    for (const BudgetOption& o : l.options) {
      if (o.stored_bits < 1)
        throw Error(at + " as " + o.format + " is stored in " + std::to_string(o.stored_bits) + " bits");
      if (!(o.error >= 0) || !std::isfinite(o.error))
        throw Error(at + " as " + o.format + " has the estimated error " + shortest(o.error) +
                    "; errors must be finite and >= 0");
    }
  }
}

// A layer's lower convex hull in (bits, error), from its cheapest option (the lowest error among
// equally cheap ones) towards lower errors: the options the LP relaxation moves through.
std::vector<std::uint32_t> hull(const BudgetLayer& l) {
  std::vector<std::uint32_t> by_bits(l.options.size());
  std::iota(by_bits.begin(), by_bits.end(), 0u);
  std::stable_sort(by_bits.begin(), by_bits.end(), [&](std::uint32_t a, std::uint32_t b) {
    const BudgetOption &x = l.options[a], &y = l.options[b];
    return x.stored_bits != y.stored_bits ? x.stored_bits < y.stored_bits : x.error < y.error;
  });
  std::vector<std::uint32_t> h;
  for (const std::uint32_t j : by_bits) {
    const BudgetOption& o = l.options[j];
    if (!h.empty() && o.error >= l.options[h.back()].error) continue;  // no better than a cheaper one
    // Drop the last point while it lies on or above the segment from the one before it to o.
    while (h.size() >= 2) {
      const BudgetOption &a = l.options[h[h.size() - 2]], &b = l.options[h.back()];
      const double lhs = (a.error - b.error) * static_cast<double>(o.stored_bits - b.stored_bits);
      const double rhs = (b.error - o.error) * static_cast<double>(b.stored_bits - a.stored_bits);
      if (lhs > rhs) break;
      h.pop_back();
    }
    h.push_back(j);
  }
  return h;
}

struct Segment {
  double slope;  // error saved per bit
  std::size_t layer, step;
  std::int64_t bits;
};

// Lower bounds on the error of layers [i, L) within a remaining capacity c, one per multiplier
// lambda >= 0: sum over those layers of min_j (error + lambda * bits), minus lambda * c (Lagrangian
// duality: any assignment within c has at least that error). The multipliers are 0 and the hull
// slopes around the LP relaxation's critical one, where the bound is tightest.
class ErrorBound {
 public:
  ErrorBound(std::span<const BudgetLayer> layers, const std::vector<Segment>& by_slope, std::size_t critical) {
    lambdas_.push_back(0.0);
    constexpr std::size_t kAround = 16;
    const std::size_t lo = critical > kAround ? critical - kAround : 0;
    for (std::size_t s = lo; s < std::min(by_slope.size(), critical + kAround); ++s)
      if (by_slope[s].slope != lambdas_.back()) lambdas_.push_back(by_slope[s].slope);
    const std::size_t L = layers.size();
    suffix_.assign(lambdas_.size() * (L + 1), 0.0);
    for (std::size_t k = 0; k < lambdas_.size(); ++k)
      for (std::size_t i = L; i-- > 0;) {
        double m = std::numeric_limits<double>::infinity();
        for (const BudgetOption& o : layers[i].options)
          m = std::min(m, o.error + lambdas_[k] * static_cast<double>(o.stored_bits));
        suffix_[k * (L + 1) + i] = suffix_[k * (L + 1) + i + 1] + m;
      }
    L_ = L;
  }

  // A lower bound for layers [i, L) within `room` bits, less a margin of 1e-9 of the terms'
  // magnitude that covers the rounding of these float64 sums.
  double at(std::size_t i, std::int64_t room) const {
    double best = 0.0;
    for (std::size_t k = 0; k < lambdas_.size(); ++k) {
      const double s = suffix_[k * (L_ + 1) + i], spare = lambdas_[k] * static_cast<double>(room);
      best = std::max(best, s - spare - 1e-9 * (s + spare));
    }
    return best;
  }

 private:
  std::vector<double> lambdas_, suffix_;
  std::size_t L_ = 0;
};

// The partial assignments kept after a layer, in lexicographic order of their option indices
// (parent order first, then option), which is the order they are generated in.
struct Frontier {
  std::vector<std::int64_t> bits;
  std::vector<double> error;
  std::vector<std::uint32_t> parent, option;  // into the previous layer's frontier; for backtracking
};

double error_sum(std::span<const BudgetLayer> layers, const std::vector<std::size_t>& chosen) {
  double e = 0.0;
  for (std::size_t i = 0; i < layers.size(); ++i) e += layers[i].options[chosen[i]].error;
  return e;
}

}  // namespace

BudgetChoice choose_under_budget(std::span<const BudgetLayer> layers, double bits_per_weight) {
  check_layers(layers, bits_per_weight);
  const std::size_t L = layers.size();
  // Suffix sums over layers [i, L): cheapest bits, and the largest errors (for `sweep`).
  std::vector<std::int64_t> min_bits(L + 1, 0);
  std::vector<double> max_error(L + 1, 0.0);
  std::int64_t numel = 0, most_bits = 0;
  for (std::size_t i = L; i-- > 0;) {
    std::int64_t lo = kMaxInt64, hi = 0;
    double e = 0.0;
    for (const BudgetOption& o : layers[i].options) {
      lo = std::min(lo, o.stored_bits);
      hi = std::max(hi, o.stored_bits);
      e = std::max(e, o.error);
    }
    if (numel > kMaxWeights - layers[i].numel || most_bits > kMaxBits - hi)
      throw Error("--budget: the layers' sizes overflow (at tensor " + detail::quote(layers[i].tensor) + ")");
    numel += layers[i].numel;
    most_bits += hi;
    min_bits[i] = min_bits[i + 1] + lo;
    max_error[i] = max_error[i + 1] + e;
  }
  const std::int64_t cap = capacity(bits_per_weight, numel, most_bits);
  if (min_bits[0] > cap)
    throw Error("--budget " + shortest(bits_per_weight) + " is below the smallest size the candidates allow: " +
                min_budget_text(min_bits[0], numel) + " bits per weight (every layer in its cheapest candidate, " +
                std::to_string(min_bits[0]) + " bits for " + std::to_string(numel) + " weights)");

  // The LP relaxation's order: hull segments by slope, steepest first (ties in layer order).
  std::vector<std::vector<std::uint32_t>> hulls(L);
  std::vector<Segment> by_slope;
  for (std::size_t i = 0; i < L; ++i) {
    hulls[i] = hull(layers[i]);
    for (std::size_t t = 0; t + 1 < hulls[i].size(); ++t) {
      const BudgetOption &a = layers[i].options[hulls[i][t]], &b = layers[i].options[hulls[i][t + 1]];
      const std::int64_t db = b.stored_bits - a.stored_bits;
      by_slope.push_back({(a.error - b.error) / static_cast<double>(db), i, t, db});
    }
  }
  std::stable_sort(by_slope.begin(), by_slope.end(),
                   [](const Segment& a, const Segment& b) { return a.slope > b.slope; });
  // A feasible assignment (the greedy rounding of the LP): segments in that order while they fit,
  // each layer's in its own order. `critical` is the first segment that did not fit.
  std::vector<std::size_t> step(L, 0);
  std::int64_t used = min_bits[0];
  std::size_t critical = by_slope.size();
  for (std::size_t s = 0; s < by_slope.size(); ++s) {
    const Segment& g = by_slope[s];
    if (step[g.layer] != g.step) continue;
    if (g.bits <= cap - used) {
      used += g.bits;
      ++step[g.layer];
    } else if (critical == by_slope.size()) {
      critical = s;
    }
  }
  std::vector<std::size_t> greedy(L);
  for (std::size_t i = 0; i < L; ++i) greedy[i] = hulls[i][step[i]];
  // States whose bound exceeds the greedy error (with a relative slack far above float64
  // rounding) cannot lead to an assignment of lower or equal error.
  const double threshold = error_sum(layers, greedy) * (1 + 1e-9);
  const ErrorBound bound(layers, by_slope, critical);

  std::vector<Frontier> kept(L);
  std::vector<std::int64_t> prev_bits{0};
  std::vector<double> prev_error{0.0};
  std::vector<std::size_t> order;
  std::vector<char> keep;
  for (std::size_t i = 0; i < L; ++i) {
    Frontier cand;
    for (std::size_t s = 0; s < prev_bits.size(); ++s)
      for (std::size_t j = 0; j < layers[i].options.size(); ++j) {
        const BudgetOption& o = layers[i].options[j];
        const std::int64_t b = prev_bits[s] + o.stored_bits;
        if (b > cap - min_bits[i + 1]) continue;
        const double e = prev_error[s] + o.error;
        if (e + bound.at(i + 1, cap - b) > threshold) continue;
        cand.bits.push_back(b);
        cand.error.push_back(e);
        cand.parent.push_back(static_cast<std::uint32_t>(s));
        cand.option.push_back(static_cast<std::uint32_t>(j));
      }
    const std::size_t n = cand.bits.size();
    order.resize(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      if (cand.bits[a] != cand.bits[b]) return cand.bits[a] < cand.bits[b];
      if (cand.error[a] != cand.error[b]) return cand.error[a] < cand.error[b];
      return a < b;
    });
    // The sweep in (bits, error, lexicographic) order. B is dropped when a kept A beats it in every
    // completion: A has fewer bits and no more error (float64 addition is monotonic, so A's total
    // stays <= B's), or equal bits, no more error and earlier indices, or equal bits and an error
    // lower by more than the remaining additions can round away (then A's total stays strictly
    // lower). Otherwise B stays: totals that meet by rounding would tie, and B's indices come first.
    keep.assign(n, 0);
    const std::size_t remaining = L - 1 - i;
    double best_fewer_bits = std::numeric_limits<double>::infinity();
    for (std::size_t g = 0; g < n;) {
      std::size_t h = g;
      while (h < n && cand.bits[order[h]] == cand.bits[order[g]]) ++h;
      double group_best = std::numeric_limits<double>::infinity();
      std::size_t group_first = n;  // the lowest index kept in this group
      for (std::size_t t = g; t < h; ++t) {
        const std::size_t c = order[t];
        const double e = cand.error[c];
        if (best_fewer_bits <= e) continue;
        if (group_first < c) continue;
        if (group_first != n) {
          const double top = (e + max_error[i + 1]) * 2;
          const double ulp = std::nextafter(top, std::numeric_limits<double>::infinity()) - top;
          if (e - group_best > 2 * static_cast<double>(remaining) * ulp) continue;
        }
        keep[c] = 1;
        group_best = std::min(group_best, e);
        group_first = std::min(group_first, c);
      }
      best_fewer_bits = std::min(best_fewer_bits, group_best);
      g = h;
    }
    Frontier& f = kept[i];
    prev_bits.clear();
    prev_error.clear();
    for (std::size_t c = 0; c < n; ++c)
      if (keep[c]) {
        prev_bits.push_back(cand.bits[c]);
        prev_error.push_back(cand.error[c]);
        f.parent.push_back(cand.parent[c]);
        f.option.push_back(cand.option[c]);
      }
  }
  // The optimum's path is never dropped (its bound stays within the greedy error), so the last
  // frontier is not empty; its first state of least error and bits is the lexicographic first.
  std::size_t best = 0;
  for (std::size_t s = 1; s < prev_bits.size(); ++s)
    if (prev_error[s] < prev_error[best] || (prev_error[s] == prev_error[best] && prev_bits[s] < prev_bits[best]))
      best = s;
  BudgetChoice choice{std::vector<std::size_t>(L), prev_bits[best], prev_error[best]};
  for (std::size_t i = L, s = best; i-- > 0;) {
    choice.chosen[i] = kept[i].option[s];
    s = kept[i].parent[s];
  }
  return choice;
}

namespace {

// sum(dW^2), in chunks of rows whose sums are added in order.
double weight_error(const float* w, const float* wq, std::int64_t rows, std::int64_t cols) {
  constexpr std::int64_t kRows = 64;
  std::vector<double> part(static_cast<std::size_t>((rows + kRows - 1) / kRows), 0.0);
  cpu::parallel_for(rows, kRows, [&](std::int64_t r0, std::int64_t r1) {
    double s = 0.0;
    for (std::int64_t i = r0 * cols; i < r1 * cols; ++i) {
      const double d = static_cast<double>(wq[i]) - static_cast<double>(w[i]);
      s += d * d;
    }
    part[static_cast<std::size_t>(r0 / kRows)] = s;
  });
  double total = 0.0;
  for (const double s : part) total += s;
  return total;
}

// trace(dW H dW^T) = sum_jk G_jk H_jk with G = dW^T dW, symmetric: G's blocks on and above the
// diagonal only, each block pair (jb <= kb) a task that sums G[jb, kb] over the rows in runs of
// kRowRun (cpu::dense_update: a fixed order per element) and weighs it with H[jb, kb] + H[kb, jb]^T
// off the diagonal; the tasks' sums are added in order.
double hessian_error(const float* w, const float* wq, std::int64_t rows, std::int64_t cols, const double* h) {
  constexpr std::int64_t kBlock = 256, kRowRun = 4 * cpu::kDenseDepth;
  const std::int64_t blocks = (cols + kBlock - 1) / kBlock;
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;
  for (std::int64_t jb = 0; jb < blocks; ++jb)
    for (std::int64_t kb = jb; kb < blocks; ++kb) pairs.emplace_back(jb, kb);
  std::vector<double> part(pairs.size(), 0.0);
  // dW[r0 : r0 + n, c0 : c0 + nc] row-major into `out`.
  auto diff = [&](std::int64_t r0, std::int64_t n, std::int64_t c0, std::int64_t nc, double* out) {
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t c = 0; c < nc; ++c) {
        const std::int64_t i = (r0 + r) * cols + c0 + c;
        out[r * nc + c] = static_cast<double>(wq[i]) - static_cast<double>(w[i]);
      }
  };
  cpu::parallel_for(static_cast<std::int64_t>(pairs.size()), 1, [&](std::int64_t p0, std::int64_t p1) {
    std::vector<double> a(static_cast<std::size_t>(kRowRun * kBlock)), b(a.size()),
        packed(static_cast<std::size_t>(cpu::packed_size(kRowRun, kBlock))),
        g(static_cast<std::size_t>(kBlock * kBlock));
    for (std::int64_t p = p0; p < p1; ++p) {
      const auto [jb, kb] = pairs[static_cast<std::size_t>(p)];
      const std::int64_t j0 = jb * kBlock, k0 = kb * kBlock;
      const std::int64_t nj = std::min(kBlock, cols - j0), nk = std::min(kBlock, cols - k0);
      std::fill(g.begin(), g.end(), 0.0);
      for (std::int64_t r0 = 0; r0 < rows; r0 += kRowRun) {
        const std::int64_t n = std::min(kRowRun, rows - r0);
        diff(r0, n, j0, nj, a.data());  // A^T for dense_update: row r holds A's column r
        if (kb != jb) diff(r0, n, k0, nk, b.data());
        cpu::pack_panels(n, nk, kb != jb ? b.data() : a.data(), nk, packed.data());
        cpu::dense_update(nj, nk, n, a.data(), nj, packed.data(), n * cpu::kDensePanel, g.data(), nk, /*add=*/true);
      }
      double s = 0.0;
      for (std::int64_t x = 0; x < nj; ++x)
        for (std::int64_t y = 0; y < nk; ++y) {
          const double hxy = h[(j0 + x) * cols + k0 + y];
          s += g[static_cast<std::size_t>(x * nk + y)] * (kb == jb ? hxy : hxy + h[(k0 + y) * cols + j0 + x]);
        }
      part[static_cast<std::size_t>(p)] = s;
    }
  });
  double total = 0.0;
  for (const double s : part) total += s;
  return total;
}

// A CSV field, quoted when it holds a comma, quote or line break (RFC 4180).
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (const char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + '"';
}

}  // namespace

double layer_output_error(std::span<const float> w, std::span<const float> wq, std::int64_t rows, std::int64_t cols,
                          std::span<const double> hessian) {
  const std::string at = "layer_output_error: ";
  if (rows < 0 || cols < 0 || (cols > 0 && rows > kMaxInt64 / cols) || (cols > 0 && cols > kMaxInt64 / cols))
    throw Error(at + "bad shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  const auto n = static_cast<std::size_t>(rows * cols);
  if (w.size() != n || wq.size() != n)
    throw Error(at + "the weight holds " + std::to_string(w.size()) + " values and its quantized form " +
                std::to_string(wq.size()) + ", expected " + std::to_string(n) + " for [" + std::to_string(rows) + ", " +
                std::to_string(cols) + "]");
  if (hessian.empty()) return weight_error(w.data(), wq.data(), rows, cols);
  if (hessian.size() != static_cast<std::size_t>(cols * cols))
    throw Error(at + "the Hessian holds " + std::to_string(hessian.size()) + " values, expected [" +
                std::to_string(cols) + ", " + std::to_string(cols) + "]");
  return hessian_error(w.data(), wq.data(), rows, cols, hessian.data());
}

std::string budget_csv(std::span<const BudgetLayer> layers, const BudgetChoice& choice) {
  if (choice.chosen.size() != layers.size())
    throw Error("budget CSV: the choice has " + std::to_string(choice.chosen.size()) + " layers, the table " +
                std::to_string(layers.size()));
  std::string out = "tensor,format,bits,error,chosen\n";
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const BudgetLayer& l = layers[i];
    if (choice.chosen[i] >= l.options.size())
      throw Error("budget CSV: tensor " + detail::quote(l.tensor) + " has no option " +
                  std::to_string(choice.chosen[i]));
    for (std::size_t j = 0; j < l.options.size(); ++j) {
      const BudgetOption& o = l.options[j];
      out += csv_field(l.tensor) + ',' + csv_field(o.format) + ',' +
             g17(static_cast<double>(o.stored_bits) / static_cast<double>(l.numel)) + ',' + g17(o.error) + ',' +
             (j == choice.chosen[i] ? '1' : '0') + '\n';
    }
  }
  return out;
}

void write_budget_csv(const std::filesystem::path& path, std::span<const BudgetLayer> layers,
                      const BudgetChoice& choice) {
  const std::string text = budget_csv(layers, choice);
  try {
    detail::AtomicFile f(path);
    f.write(text);
    f.commit();
  } catch (const Error& e) {
    throw Error("cannot write the budget CSV " + detail::quote(path.string()) + ": " + e.what());
  }
}

}  // namespace microscale::io::ck
