#include "plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace microscale::cli {

namespace {

// ---- PNG container

std::uint32_t crc32(const unsigned char* p, std::size_t n, std::uint32_t crc = 0) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void put32(std::vector<unsigned char>& v, std::uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<unsigned char>(x >> s));
}

void chunk(std::vector<unsigned char>& png, const char* type, const std::vector<unsigned char>& data) {
  put32(png, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put32(png, crc32(png.data() + start, png.size() - start));
}

// ---- drawing

// 5x7 glyphs plus two descender rows, one byte per row, bit 4 = leftmost column. Letters are
// lower case; upper case text is drawn with them.
struct Glyph {
  char c;
  std::uint8_t rows[9];
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}}, {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}}, {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}}, {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
    {'g', {0x00, 0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x11, 0x0E}}, {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}}, {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}}, {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, {'p', {0x00, 0x00, 0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x00}},
    {'q', {0x00, 0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x01, 0x00}}, {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0x00, 0x00, 0x0F, 0x10, 0x0E, 0x01, 0x1E}}, {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}}, {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}}, {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
    {'y', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x11, 0x0E}}, {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}}, {'/', {0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}}, {',', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08, 0x00}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}}, {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'^', {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00}}, {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
};

const Glyph* glyph(char c) {
  if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  for (const Glyph& g : kFont)
    if (g.c == c) return &g;
  return nullptr;  // space and anything unknown: blank
}

enum Color : unsigned char { kWhite, kBlack, kGrid, kText, kFirstPoint };
constexpr int kPointColors = 12;
constexpr unsigned char kPalette[16][3] = {
    {255, 255, 255}, {0, 0, 0},      {225, 225, 225}, {70, 70, 70},   {31, 119, 180},  {255, 127, 14},
    {44, 160, 44},   {214, 39, 40},  {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
    {188, 189, 34},  {23, 190, 207}, {0, 70, 140},    {170, 80, 0}};

struct Canvas {
  int w, h;
  std::vector<unsigned char> px;
  Canvas(int w_, int h_) : w(w_), h(h_), px(static_cast<std::size_t>(w_ * h_), kWhite) {}
  void set(int x, int y, unsigned char c) {
    if (x >= 0 && y >= 0 && x < w && y < h) px[static_cast<std::size_t>(y * w + x)] = c;
  }
  void hline(int x0, int x1, int y, unsigned char c) {
    for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  void vline(int x, int y0, int y1, unsigned char c) {
    for (int y = y0; y <= y1; ++y) set(x, y, c);
  }
  void disc(int cx, int cy, int r, unsigned char c) {
    for (int y = -r; y <= r; ++y)
      for (int x = -r; x <= r; ++x)
        if (x * x + y * y <= r * r + r) set(cx + x, cy + y, c);
  }
  // Text at (x, y) = top-left; `scale` enlarges each font pixel; `vertical` rotates 90 degrees
  // counter-clockwise (for the y-axis label), reading bottom to top from (x, y).
  void text(int x, int y, const std::string& s, unsigned char c, int scale = 1, bool vertical = false) {
    for (std::size_t i = 0; i < s.size(); ++i) {
      const Glyph* g = glyph(s[i]);
      if (!g) continue;
      const int off = static_cast<int>(i) * 6 * scale;
      for (int r = 0; r < 9; ++r)
        for (int col = 0; col < 5; ++col)
          if (g->rows[r] & (0x10 >> col))
            for (int a = 0; a < scale; ++a)
              for (int b = 0; b < scale; ++b) {
                if (vertical)
                  set(x + r * scale + a, y - off - col * scale - b, c);
                else
                  set(x + off + col * scale + a, y + r * scale + b, c);
              }
    }
  }
  static int text_width(const std::string& s, int scale = 1) { return static_cast<int>(s.size()) * 6 * scale - scale; }
};

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::vector<unsigned char> encode_png_palette4(int w, int h, const std::vector<unsigned char>& pixels,
                                               const unsigned char (&palette)[16][3]) {
  // Scanlines: filter byte 0, then two pixels per byte (first pixel in the high nibble, as PNG
  // orders sub-byte samples).
  const std::size_t stride = static_cast<std::size_t>((w + 1) / 2);
  std::vector<unsigned char> raw;
  raw.reserve((stride + 1) * static_cast<std::size_t>(h));
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    for (int x = 0; x < w; x += 2) {
      const auto hi = static_cast<unsigned>(pixels[static_cast<std::size_t>(y * w + x)] & 15);
      const auto lo = x + 1 < w ? static_cast<unsigned>(pixels[static_cast<std::size_t>(y * w + x + 1)] & 15) : 0u;
      raw.push_back(static_cast<unsigned char>(hi << 4 | lo));
    }
  }
  // zlib stream of stored deflate blocks (each at most 65535 bytes) and the Adler-32 checksum.
  std::vector<unsigned char> z = {0x78, 0x01};
  for (std::size_t pos = 0; pos < raw.size() || pos == 0;) {
    const std::size_t n = std::min<std::size_t>(65535, raw.size() - pos);
    const bool last = pos + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<unsigned char>(n & 0xFF));
    z.push_back(static_cast<unsigned char>(n >> 8));
    z.push_back(static_cast<unsigned char>(~n & 0xFF));
    z.push_back(static_cast<unsigned char>((~n >> 8) & 0xFF));
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(pos), raw.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    if (last) break;
  }
  std::uint32_t a = 1, b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  put32(z, b << 16 | a);

  std::vector<unsigned char> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<unsigned char> ihdr;
  put32(ihdr, static_cast<std::uint32_t>(w));
  put32(ihdr, static_cast<std::uint32_t>(h));
  ihdr.insert(ihdr.end(), {4, 3, 0, 0, 0});  // 4-bit depth, palette colour, deflate, no filter, no interlace
  chunk(png, "IHDR", ihdr);
  std::vector<unsigned char> plte;
  for (const auto& rgb : palette) plte.insert(plte.end(), rgb, rgb + 3);
  chunk(png, "PLTE", plte);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", {});
  return png;
}

std::vector<unsigned char> scatter_png(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                                       const std::vector<PlotPoint>& points) {
  const int W = 900, H = 600, L = 90, R = 40, T = 60, B = 70;  // canvas and plot margins
  Canvas cv(W, H);
  std::vector<PlotPoint> pts;
  for (const PlotPoint& p : points)
    if (p.y > 0 && std::isfinite(p.y) && std::isfinite(p.x)) pts.push_back(p);

  double x0 = 0, x1 = 1, e0 = -3, e1 = 0;  // x range, log10 y range
  if (!pts.empty()) {
    x0 = x1 = pts[0].x;
    e0 = e1 = std::log10(pts[0].y);
    for (const PlotPoint& p : pts) {
      x0 = std::min(x0, p.x);
      x1 = std::max(x1, p.x);
      e0 = std::min(e0, std::log10(p.y));
      e1 = std::max(e1, std::log10(p.y));
    }
  }
  x0 = std::floor(x0) - 0.5;
  x1 = std::ceil(x1) + 0.5;
  e0 = std::floor(e0);
  e1 = std::max(std::ceil(e1), e0 + 1);
  const int pw = W - L - R, ph = H - T - B;
  auto sx = [&](double x) { return L + static_cast<int>(std::lround((x - x0) / (x1 - x0) * pw)); };
  auto sy = [&](double y) { return T + ph - static_cast<int>(std::lround((std::log10(y) - e0) / (e1 - e0) * ph)); };

  // Grid and ticks: every bit on x, every decade (with 2x and 5x minor lines) on y.
  const int xstep = x1 - x0 > 12 ? 2 : 1;
  for (int b = static_cast<int>(std::ceil(x0)); b <= static_cast<int>(x1); b += xstep) {
    cv.vline(sx(b), T, T + ph, kGrid);
    const std::string s = tick_label(b);
    cv.text(sx(b) - Canvas::text_width(s) / 2, T + ph + 8, s, kText);
  }
  for (int e = static_cast<int>(e0); e <= static_cast<int>(e1); ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double y = m * std::pow(10.0, e);
      if (std::log10(y) > e1 + 1e-9) break;
      cv.hline(L, L + pw, sy(y), kGrid);
    }
    const std::string s = "1e" + std::to_string(e);
    cv.text(L - 8 - Canvas::text_width(s), sy(std::pow(10.0, e)) - 3, s, kText);
  }
  cv.hline(L, L + pw, T, kBlack);
  cv.hline(L, L + pw, T + ph, kBlack);
  cv.vline(L, T, T + ph, kBlack);
  cv.vline(L + pw, T, T + ph, kBlack);

  cv.text((W - Canvas::text_width(title, 2)) / 2, 18, title, kBlack, 2);
  cv.text(L + (pw - Canvas::text_width(xlabel)) / 2, H - 30, xlabel, kBlack);
  cv.text(22, T + (ph + Canvas::text_width(ylabel)) / 2, ylabel, kBlack, 1, true);

  // Points, then labels placed right of each point, nudged down past labels already placed.
  struct Box {
    int x0, y0, x1, y1;
  };
  std::vector<Box> used;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const auto color = static_cast<unsigned char>(kFirstPoint + static_cast<int>(i % kPointColors));
    cv.disc(sx(pts[i].x), sy(pts[i].y), 5, color);
  }
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const auto color = static_cast<unsigned char>(kFirstPoint + static_cast<int>(i % kPointColors));
    const int tw = Canvas::text_width(pts[i].label);
    int x = sx(pts[i].x) + 9, y = sy(pts[i].y) - 3;
    if (x + tw > L + pw - 2) x = sx(pts[i].x) - 9 - tw;  // no room on the right
    for (int tries = 0; tries < 12; ++tries) {
      const bool clash = std::any_of(used.begin(), used.end(), [&](const Box& b) {
        return x < b.x1 && x + tw > b.x0 && y < b.y1 && y + 10 > b.y0;
      });
      if (!clash) break;
      y += 11;
    }
    used.push_back({x - 1, y - 1, x + tw + 1, y + 10});
    cv.text(x, y, pts[i].label, color);
  }

  return encode_png_palette4(W, H, cv.px, kPalette);
}

}  // namespace microscale::cli
