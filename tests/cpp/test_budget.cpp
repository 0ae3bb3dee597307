// quantize --budget's chooser (src/io/budget.hpp, docs/numerics.md "Formats under a size budget"):
// the exact optimum against brute force, the tie rule, the exact capacity, refusals; the error
// estimate against naive float64 sums; the CSV's text.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "io/budget.hpp"
#include "microscale/dtype.hpp"
#include "microscale/runtime.hpp"

namespace {

namespace fs = std::filesystem;
using microscale::io::ck::budget_csv;
using microscale::io::ck::BudgetChoice;
using microscale::io::ck::BudgetLayer;
using microscale::io::ck::BudgetOption;
using microscale::io::ck::choose_under_budget;
using microscale::io::ck::layer_output_error;
using microscale::io::ck::write_budget_csv;

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one containing: " << part;
  } catch (const microscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// prefix + i, appended (GCC 12's -Wrestrict misfires on "literal" + std::string temporaries).
std::string numbered(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

struct Best {
  bool feasible = false;
  std::vector<std::size_t> chosen;
  std::int64_t bits = 0;
  double error = 0;
};

// Every assignment in lexicographic order; the first of least (error summed in layer order, bits)
// within `capacity` bits.
Best brute_force(const std::vector<BudgetLayer>& layers, std::int64_t capacity) {
  Best best;
  std::vector<std::size_t> c(layers.size(), 0);
  while (true) {
    std::int64_t bits = 0;
    double error = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      bits += layers[i].options[c[i]].stored_bits;
      error += layers[i].options[c[i]].error;
    }
    if (bits <= capacity && (!best.feasible || error < best.error || (error == best.error && bits < best.bits)))
      best = {true, c, bits, error};
    std::size_t i = layers.size();
    while (i > 0 && ++c[i - 1] == layers[i - 1].options.size()) c[--i] = 0;
    if (i == 0) return best;
  }
}

// Greedy by error saved per extra bit: what an inexact chooser would do.
std::vector<std::size_t> greedy_by_ratio(const std::vector<BudgetLayer>& layers, std::int64_t capacity) {
  std::vector<std::size_t> c(layers.size());
  std::int64_t bits = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const auto& o = layers[i].options;
    c[i] = static_cast<std::size_t>(
        std::min_element(o.begin(), o.end(),
                         [](const BudgetOption& a, const BudgetOption& b) { return a.stored_bits < b.stored_bits; }) -
        o.begin());
    bits += o[c[i]].stored_bits;
  }
  while (true) {
    double best_ratio = 0;
    std::size_t bl = 0, bj = 0;
    for (std::size_t i = 0; i < layers.size(); ++i)
      for (std::size_t j = 0; j < layers[i].options.size(); ++j) {
        const BudgetOption &from = layers[i].options[c[i]], &to = layers[i].options[j];
        const std::int64_t db = to.stored_bits - from.stored_bits;
        if (db <= 0 || to.error >= from.error || bits + db > capacity) continue;
        const double r = (from.error - to.error) / static_cast<double>(db);
        if (r > best_ratio) best_ratio = r, bl = i, bj = j;
      }
    if (best_ratio == 0) return c;
    bits += layers[bl].options[bj].stored_bits - layers[bl].options[c[bl]].stored_bits;
    c[bl] = bj;
  }
}

double error_of(const std::vector<BudgetLayer>& layers, const std::vector<std::size_t>& c) {
  double e = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) e += layers[i].options[c[i]].error;
  return e;
}

// Random layers whose weights total a power of two, so that bits / total is exact in float64 and
// the budget of `b` bits is b / total bits per weight. `kind` 0: errors in eighths (many ties),
// 1: random doubles, 2: a mix including large and tiny values (totals that round).
std::vector<BudgetLayer> random_layers(std::mt19937_64& rng, int kind, std::int64_t& total) {
  std::uniform_int_distribution<int> nl(1, 8), no(1, 4), small(0, 24);
  std::uniform_real_distribution<double> u(0, 1);
  const int L = nl(rng);
  std::vector<BudgetLayer> layers;
  total = 0;
  for (int i = 0; i < L; ++i) {
    BudgetLayer l{numbered("layer", i), 16 * (1 + small(rng) % 8), {}};
    const int n = no(rng);
    for (int j = 0; j < n; ++j) {
      // bits from a few per-weight rates (duplicates across options happen)
      const std::int64_t rate = 2 + small(rng) % 7;
      double e = 0;
      if (kind == 0)
        e = small(rng) / 8.0;
      else if (kind == 1)
        e = u(rng);
      else
        e = std::ldexp(1 + u(rng), small(rng) % 3 == 0 ? 53 : -(small(rng) % 4));
      l.options.push_back({numbered("f", j), rate * l.numel + (small(rng) % 2) * 32, e});
    }
    total += l.numel;
    layers.push_back(std::move(l));
  }
  std::int64_t p = 1;
  while (p < total) p *= 2;
  layers.back().numel += p - total;  // counts for the average only
  total = p;
  return layers;
}

TEST(Budget, MatchesBruteForceOnRandomInstances) {
  std::mt19937_64 rng(7);
  int compared = 0, greedy_worse = 0, infeasible = 0;
  for (int t = 0; t < 1500; ++t) {
    std::int64_t total = 0;
    const std::vector<BudgetLayer> layers = random_layers(rng, t % 3, total);
    std::int64_t lo = 0, hi = 0;
    for (const auto& l : layers) {
      std::int64_t a = INT64_MAX, b = 0;
      for (const auto& o : l.options) a = std::min(a, o.stored_bits), b = std::max(b, o.stored_bits);
      lo += a, hi += b;
    }
    for (const std::int64_t cap : {lo - 1, lo, lo + (hi - lo) / 4, lo + (hi - lo) / 2, hi - 1, hi, hi + 100}) {
      if (cap < 1) continue;
      const double bpw = static_cast<double>(cap) / static_cast<double>(total);
      const Best want = brute_force(layers, cap);
      if (!want.feasible) {
        ++infeasible;
        expect_error([&] { choose_under_budget(layers, bpw); }, "below the smallest size");
        continue;
      }
      const BudgetChoice got = choose_under_budget(layers, bpw);
      ASSERT_EQ(got.chosen, want.chosen) << "instance " << t << ", capacity " << cap;
      EXPECT_EQ(got.error, want.error);
      EXPECT_EQ(got.stored_bits, want.bits);
      EXPECT_LE(got.stored_bits, cap);
      ++compared;
      if (error_of(layers, greedy_by_ratio(layers, cap)) > want.error) ++greedy_worse;
    }
  }
  EXPECT_GT(compared, 5000);
  EXPECT_GT(infeasible, 1000);
  // The instances are ones where choosing by error saved per bit is not optimal.
  EXPECT_GT(greedy_worse, 100);
}

// Larger instances (12 layers of 3 options) exercise the pruning with a deep frontier.
TEST(Budget, MatchesBruteForceOnTwelveLayers) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < 6; ++t) {
    std::vector<BudgetLayer> layers;
    std::int64_t total = 0;
    for (int i = 0; i < 12; ++i) {
      const std::int64_t n = 64 << (i % 3);
      const double s = std::exp(4 * u(rng));
      layers.push_back({numbered("l", i),
                        n,
                        {{"nvfp4", n * 9 / 2 + 32, s * (1 + u(rng))},
                         {"mxfp8", n * 33 / 4, s * 0.1 * (1 + u(rng))},
                         {"keep", 16 * n, 0.0}}});
      total += n;
    }
    for (const double bpw : {4.8, 5.0, 6.0, 8.0, 10.0, 15.9}) {
      const Best want = brute_force(layers, static_cast<std::int64_t>(bpw * static_cast<double>(total)));
      const BudgetChoice got = choose_under_budget(layers, bpw);
      EXPECT_EQ(got.chosen, want.chosen) << t << " " << bpw;
      EXPECT_EQ(got.error, want.error);
    }
  }
}

TEST(Budget, TieRules) {
  // Three identical layers, room for one upgrade: three assignments tie in error and bits, the
  // lexicographically smallest indices win ({0, 0, 1}).
  const BudgetLayer same{"t", 64, {{"nvfp4", 320, 3.0}, {"mxfp8", 528, 1.0}}};
  std::vector<BudgetLayer> layers{same, same, same};
  layers[1].tensor = "u";
  layers[2].tensor = "v";
  BudgetChoice c = choose_under_budget(layers, (320.0 * 2 + 528 + 10) / 192);
  EXPECT_EQ(c.chosen, (std::vector<std::size_t>{0, 0, 1}));
  EXPECT_EQ(c.error, 7.0);
  EXPECT_EQ(c.stored_bits, 320 * 2 + 528);
  // Equal errors: the fewer bits, whatever the option's index.
  layers = {{"a", 64, {{"x", 400, 1.0}, {"y", 300, 1.0}, {"z", 350, 1.0}}}};
  c = choose_under_budget(layers, 16);
  EXPECT_EQ(c.chosen, (std::vector<std::size_t>{1}));
  // Totals that only meet by rounding tie: 2^53 + 0.75 and 2^53 + 0.5 both round to 2^53, so the
  // first option of the first layer (the higher error before rounding) is chosen.
  layers = {{"a", 64, {{"x", 100, 0.75}, {"y", 100, 0.5}}}, {"b", 64, {{"x", 100, std::ldexp(1.0, 53)}}}};
  c = choose_under_budget(layers, 16);
  EXPECT_EQ(c.chosen, (std::vector<std::size_t>{0, 0}));
  EXPECT_EQ(c.error, std::ldexp(1.0, 53));
  // The same choice on every call.
  std::mt19937_64 rng(3);
  std::int64_t total = 0;
  for (int t = 0; t < 50; ++t) {
    const auto r = random_layers(rng, 0, total);
    std::int64_t hi = 0;
    for (const auto& l : r)
      hi += std::max_element(l.options.begin(), l.options.end(), [](auto& a, auto& b) {
              return a.stored_bits < b.stored_bits;
            })->stored_bits;
    const double bpw = static_cast<double>(hi) / static_cast<double>(total);
    EXPECT_EQ(choose_under_budget(r, bpw).chosen, choose_under_budget(r, bpw).chosen);
  }
}

TEST(Budget, CapacityIsExact) {
  // S bits for 3 weights fit S / 3 bits per weight exactly when the double S / 3 is not below the
  // real quotient (7/3 rounds up, 2/3 down): the bound is the real product, not a rounded one.
  for (const std::int64_t S : {7, 2}) {
    const std::vector<BudgetLayer> layers{{"a", 3, {{"x", S, 0.0}}}};
    const double q = static_cast<double>(S) / 3.0;
    const bool rounds_down = std::fma(q, 3.0, -static_cast<double>(S)) < 0;
    const double fits = rounds_down ? std::nextafter(q, 10.0) : q;
    const double short_of = rounds_down ? q : std::nextafter(q, 0.0);
    EXPECT_EQ(choose_under_budget(layers, fits).stored_bits, S);
    expect_error([&] { choose_under_budget(layers, short_of); }, "below the smallest size");
  }
}

TEST(Budget, RefusesAnInfeasibleBudgetNamingTheMinimum) {
  // Cheapest: 2 x (64 x 4.5 + 32) = 640 bits for 128 weights, 5 bits per weight.
  const BudgetLayer l{"model.layers.0.mlp.down_proj.weight", 64, {{"nvfp4", 320, 2.0}, {"keep", 1024, 0.0}}};
  std::vector<BudgetLayer> layers{l, l};
  layers[1].tensor = "model.layers.1.mlp.down_proj.weight";
  EXPECT_EQ(choose_under_budget(layers, 5.0).chosen, (std::vector<std::size_t>{0, 0}));
  expect_error([&] { choose_under_budget(layers, 4.99); }, "--budget 4.99 is below the smallest size");
  expect_error([&] { choose_under_budget(layers, 4.99); }, "5.000000 bits per weight");
  // A minimum that is not a whole number of millionths is rounded up, so the printed value fits.
  layers[1].options[0].stored_bits = 321;
  expect_error([&] { choose_under_budget(layers, 5.0); }, "5.007813 bits per weight");
  EXPECT_EQ(choose_under_budget(layers, 5.007813).chosen, (std::vector<std::size_t>{0, 0}));
}

TEST(Budget, RefusesBadInputs) {
  const BudgetLayer good{"w", 16, {{"nvfp4", 104, 1.0}}};
  auto with = [&](auto change) {
    std::vector<BudgetLayer> l{good};
    change(l[0]);
    return l;
  };
  expect_error([&] { choose_under_budget({}, 5.0); }, "no layers");
  expect_error([&] { choose_under_budget(with([](BudgetLayer& l) { l.options.clear(); }), 5.0); },
               "tensor \"w\" has no candidate formats");
  expect_error([&] { choose_under_budget(with([](BudgetLayer& l) { l.numel = 0; }), 5.0); }, "has 0 weights");
  expect_error([&] { choose_under_budget(with([](BudgetLayer& l) { l.options[0].stored_bits = 0; }), 5.0); },
               "\"w\" as nvfp4 is stored in 0 bits");
  for (const double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()})
    expect_error([&] { choose_under_budget(with([&](BudgetLayer& l) { l.options[0].error = bad; }), 7.0); },
                 "errors must be finite and >= 0");
  for (const double bad : {0.0, -5.0, std::nan(""), std::numeric_limits<double>::infinity()})
    expect_error([&] { choose_under_budget(std::vector<BudgetLayer>{good}, bad); },
                 "--budget must be a positive number");
  const BudgetLayer huge{"w", 16, {{"nvfp4", INT64_MAX / 2 + 1, 1.0}}};
  expect_error([&] { choose_under_budget(std::vector<BudgetLayer>{huge, huge}, 5.0); }, "sizes overflow");
}

// An 8B model's 224 linear layers (32 blocks of q, k, v, o, gate, up, down) with nvfp4 (4.5 bits
// + a 32-bit global scale), mxfp8 (8.25) and bf16 (16), errors proportional to size with a
// per-layer sensitivity: the time of the choice is printed, not asserted.
TEST(Budget, EightBModelShape) {
  std::mt19937_64 rng(5);
  std::lognormal_distribution<double> sens(0, 1.5);
  std::uniform_real_distribution<double> u(0.5, 2);
  const std::int64_t H = 4096, KV = 1024, F = 14336;
  const std::pair<const char*, std::int64_t> shapes[] = {{"q_proj", H * H},   {"k_proj", KV * H},   {"v_proj", KV * H},
                                                         {"o_proj", H * H},   {"gate_proj", F * H}, {"up_proj", F * H},
                                                         {"down_proj", H * F}};
  std::vector<BudgetLayer> layers;
  for (int b = 0; b < 32; ++b)
    for (const auto& [name, n] : shapes) {
      const double s = sens(rng) * 1e-4 * static_cast<double>(n);
      layers.push_back(
          {"model.layers." + std::to_string(b) + "." + name + ".weight",
           n,
           {{"nvfp4", n * 9 / 2 + 32, s * u(rng)}, {"mxfp8", n * 33 / 4, s * 0.03 * u(rng)}, {"keep", 16 * n, 0.0}}});
    }
  std::int64_t total = 0;
  for (const auto& l : layers) total += l.numel;
  for (const double bpw : {4.6, 5.0, 6.0, 8.25, 12.0}) {
    const auto t0 = std::chrono::steady_clock::now();
    const BudgetChoice c = choose_under_budget(layers, bpw);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("224 layers x 3 candidates, budget %.2f: %.1f ms, %.4f bits per weight, error %.6g\n", bpw, ms,
                static_cast<double>(c.stored_bits) / static_cast<double>(total), c.error);
    EXPECT_LE(static_cast<double>(c.stored_bits), bpw * static_cast<double>(total));
    const double greedy =
        error_of(layers, greedy_by_ratio(layers, static_cast<std::int64_t>(bpw * static_cast<double>(total))));
    EXPECT_LE(c.error, greedy);
  }
}

// The naive formula: sum_r sum_jk dW_rj H_jk dW_rk (long double), or sum dW^2.
long double naive_error(const std::vector<float>& w, const std::vector<float>& wq, std::int64_t rows, std::int64_t cols,
                        const std::vector<double>& h) {
  long double total = 0;
  std::vector<long double> d(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < cols; ++j)
      d[static_cast<std::size_t>(j)] = static_cast<long double>(wq[static_cast<std::size_t>(r * cols + j)]) -
                                       static_cast<long double>(w[static_cast<std::size_t>(r * cols + j)]);
    for (std::int64_t j = 0; j < cols; ++j) {
      if (h.empty()) {
        total += d[static_cast<std::size_t>(j)] * d[static_cast<std::size_t>(j)];
        continue;
      }
      long double s = 0;
      for (std::int64_t k = 0; k < cols; ++k)
        s += static_cast<long double>(h[static_cast<std::size_t>(j * cols + k)]) * d[static_cast<std::size_t>(k)];
      total += d[static_cast<std::size_t>(j)] * s;
    }
  }
  return total;
}

TEST(LayerOutputError, MatchesNaiveSums) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0, 1);
  // Shapes across the 256-column blocks and the 1024-row runs of the Hessian product.
  for (const auto& [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {3, 17}, {40, 256}, {7, 300}, {1030, 260}, {0, 5}, {5, 0}}) {
    const auto n = static_cast<std::size_t>(rows * cols);
    std::vector<float> w(n), wq(n);
    for (std::size_t i = 0; i < n; ++i) {
      w[i] = nd(rng);
      wq[i] = w[i] + 0.05f * nd(rng);
    }
    // H = X^T X of 2 * cols random samples, made non-symmetric in one case (trace sees its
    // symmetric part; the naive formula uses H as given).
    const std::int64_t S = 2 * cols + 1;
    std::vector<double> x(static_cast<std::size_t>(S * cols)), h(static_cast<std::size_t>(cols * cols), 0.0),
        eye(h.size(), 0.0);
    for (double& v : x) v = nd(rng);
    for (std::int64_t j = 0; j < cols; ++j) {
      eye[static_cast<std::size_t>(j * cols + j)] = 1;
      for (std::int64_t k = 0; k < cols; ++k)
        for (std::int64_t s = 0; s < S; ++s)
          h[static_cast<std::size_t>(j * cols + k)] +=
              x[static_cast<std::size_t>(s * cols + j)] * x[static_cast<std::size_t>(s * cols + k)];
    }
    if (cols == 17) h[1] += 3.5;
    const double plain = layer_output_error(w, wq, rows, cols);
    const double with_h = layer_output_error(w, wq, rows, cols, h);
    const long double want_plain = naive_error(w, wq, rows, cols, {});
    const long double want_h = naive_error(w, wq, rows, cols, h);
    EXPECT_NEAR(plain, static_cast<double>(want_plain), 1e-13 * static_cast<double>(want_plain)) << rows << "x" << cols;
    EXPECT_NEAR(with_h, static_cast<double>(want_h), 1e-12 * static_cast<double>(want_h)) << rows << "x" << cols;
    EXPECT_NEAR(layer_output_error(w, wq, rows, cols, eye), plain, 1e-13 * plain);
    if (n > 0) {
      EXPECT_GT(plain, 0);
      EXPECT_GT(with_h, 0);
    }
    EXPECT_EQ(layer_output_error(w, w, rows, cols, h), 0.0);
    // The same bits on one thread and on several.
    microscale::set_num_threads(1);
    const double one = layer_output_error(w, wq, rows, cols, h), one_plain = layer_output_error(w, wq, rows, cols);
    microscale::set_num_threads(4);
    EXPECT_EQ(layer_output_error(w, wq, rows, cols, h), one);
    EXPECT_EQ(layer_output_error(w, wq, rows, cols), one_plain);
    microscale::set_num_threads(0);
  }
}

TEST(LayerOutputError, RefusesMismatchedSizes) {
  const std::vector<float> w(12, 1.0f), short_wq(11, 1.0f);
  const std::vector<double> h(9, 1.0);
  expect_error([&] { layer_output_error(w, short_wq, 3, 4); }, "its quantized form 11, expected 12 for [3, 4]");
  expect_error([&] { layer_output_error(w, w, 3, 4, h); }, "the Hessian holds 9 values, expected [4, 4]");
  expect_error([&] { layer_output_error(w, w, -3, -4); }, "bad shape [-3, -4]");
}

// RFC 4180 records back into fields.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        rows.back().back() += c, ++i;
      else if (c == '"')
        quoted = false;
      else
        rows.back().back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\n') {
      rows.emplace_back(1);
    } else {
      rows.back().back() += c;
    }
  }
  rows.pop_back();  // after the last line break
  return rows;
}

TEST(BudgetCsv, ExactTextAndAtomicWrite) {
  const std::vector<BudgetLayer> layers{
      {"a.weight", 16, {{"nvfp4", 104, 0.25}, {"mxfp8", 132, 0.1}, {"keep", 256, 0.0}}},
      {"x,\"y\".weight", 3, {{"nvfp4", 7, 1.0 / 3}, {"keep", 48, 0.0}}}};
  const BudgetChoice choice = choose_under_budget(layers, 145.0 / 19);
  ASSERT_EQ(choice.chosen, (std::vector<std::size_t>{1, 0}));
  const std::string text = budget_csv(layers, choice);
  EXPECT_EQ(text,
            "tensor,format,bits,error,chosen\n"
            "a.weight,nvfp4,6.5,0.25,0\n"
            "a.weight,mxfp8,8.25,0.10000000000000001,1\n"
            "a.weight,keep,16,0,0\n"
            "\"x,\"\"y\"\".weight\",nvfp4,2.3333333333333335,0.33333333333333331,1\n"
            "\"x,\"\"y\"\".weight\",keep,16,0,0\n");
  const auto rows = parse_csv(text);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"tensor", "format", "bits", "error", "chosen"}));
  std::size_t r = 1;
  for (std::size_t i = 0; i < layers.size(); ++i)
    for (std::size_t j = 0; j < layers[i].options.size(); ++j, ++r) {
      ASSERT_EQ(rows[r].size(), 5u);
      EXPECT_EQ(rows[r][0], layers[i].tensor);
      EXPECT_EQ(rows[r][1], layers[i].options[j].format);
      EXPECT_EQ(std::stod(rows[r][2]),
                static_cast<double>(layers[i].options[j].stored_bits) / static_cast<double>(layers[i].numel));
      EXPECT_EQ(std::stod(rows[r][3]), layers[i].options[j].error);
      EXPECT_EQ(rows[r][4], j == choice.chosen[i] ? "1" : "0");
    }

  const fs::path dir = fs::temp_directory_path() / ("microscale_budget_csv_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path out = dir / "budget.csv";
  write_budget_csv(out, layers, choice);
  std::ifstream in(out, std::ios::binary);
  std::stringstream read;
  read << in.rdbuf();
  EXPECT_EQ(read.str(), text);
  // A choice that does not fit the table is refused before anything is written; an unwritable
  // place is named.
  expect_error([&] { write_budget_csv(dir / "bad.csv", layers, BudgetChoice{{0}, 0, 0}); }, "the choice has 1 layers");
  expect_error([&] { write_budget_csv(dir / "bad.csv", layers, BudgetChoice{{0, 5}, 0, 0}); }, "has no option 5");
  expect_error([&] { write_budget_csv(dir / "missing" / "b.csv", layers, choice); }, "missing/b.csv");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // budget.csv alone
  fs::remove_all(dir);
}

}  // namespace
