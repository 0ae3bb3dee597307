#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace microscale::cli {

namespace {

constexpr const char* kPointColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                        "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#00468c", "#aa5000"};
constexpr int kFontSize = 12, kTitleSize = 18;

// Length in bytes of the UTF-8 sequence at s[i] when it encodes a character XML allows, else 0
// (bytes of another encoding, overlong forms, surrogates, U+FFFE/U+FFFF, C0 controls but tab).
std::size_t xml_char_length(const std::string& s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return c >= 0x20 || c == '\t' ? 1 : 0;
  const std::size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  char32_t cp = c & (0x7F >> n);
  for (std::size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (d & 0x3F);
  }
  constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  const bool ok = cp >= kSmallest[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF) && cp != 0xFFFE && cp != 0xFFFF;
  return ok ? n : 0;
}

// Text as XML character data: markup characters escaped, and whatever XML cannot hold (a directory
// name may be in another encoding or hold control characters) written as '?', so the document
// always parses.
std::string xml_text(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = xml_char_length(s, i);
    const char c = s[i];
    if (n == 0)
      out += '?';
    else if (c == '&')
      out += "&amp;";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '"')
      out += "&quot;";
    else
      out.append(s, i, n);
    i += n ? n : 1;
  }
  return out;
}

// Width of a label in pixels, for placing labels apart (about 0.6 em per character).
int text_width(const std::string& s) { return static_cast<int>(s.size()) * kFontSize * 3 / 5; }

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string scatter_svg(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                        const std::vector<PlotPoint>& points) {
  const int W = 900, H = 600, L = 90, R = 40, T = 60, B = 70;  // canvas and plot margins
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

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
      << ' ' << H << "\" font-family=\"sans-serif\" font-size=\"" << kFontSize << "\">\n"
      << "<title>" << xml_text(title) << "</title>\n"
      << "<rect width=\"" << W << "\" height=\"" << H << "\" fill=\"white\"/>\n";
  auto line = [&](int ax, int ay, int bx, int by, const char* color) {
    svg << "<line x1=\"" << ax << "\" y1=\"" << ay << "\" x2=\"" << bx << "\" y2=\"" << by << "\" stroke=\"" << color
        << "\"/>\n";
  };
  auto text = [&](int x, int y, const std::string& s, const char* anchor, const std::string& extra = "") {
    svg << "<text x=\"" << x << "\" y=\"" << y << "\" text-anchor=\"" << anchor << '"' << extra << '>' << xml_text(s)
        << "</text>\n";
  };

  // Grid and ticks: every bit on x, every decade (with 2x and 5x minor lines) on y.
  svg << "<g class=\"grid\" fill=\"#464646\">\n";
  const int xstep = x1 - x0 > 12 ? 2 : 1;
  for (int b = static_cast<int>(std::ceil(x0)); b <= static_cast<int>(x1); b += xstep) {
    line(sx(b), T, sx(b), T + ph, "#e1e1e1");
    text(sx(b), T + ph + 18, tick_label(b), "middle");
  }
  for (int e = static_cast<int>(e0); e <= static_cast<int>(e1); ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double y = m * std::pow(10.0, e);
      if (std::log10(y) > e1 + 1e-9) break;
      line(L, sy(y), L + pw, sy(y), "#e1e1e1");
    }
    text(L - 8, sy(std::pow(10.0, e)) + 4, "1e" + std::to_string(e), "end");
  }
  svg << "</g>\n<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"black\"/>\n";

  text(W / 2, 34, title, "middle", " font-size=\"" + std::to_string(kTitleSize) + "\"");
  text(L + pw / 2, H - 22, xlabel, "middle");
  const int ylabel_y = T + ph / 2;
  text(28, ylabel_y, ylabel, "middle", " transform=\"rotate(-90 28 " + std::to_string(ylabel_y) + ")\"");

  // One series per point: its marker, and its label right of it, nudged down past labels already
  // placed (left of it where the plot ends).
  struct Box {
    int x0, y0, x1, y1;
  };
  std::vector<Box> used;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const char* color = kPointColors[i % std::size(kPointColors)];
    const int px = sx(pts[i].x), py = sy(pts[i].y), tw = text_width(pts[i].label);
    int x = px + 9, y = py - 6;  // the label's top-left corner
    if (x + tw > L + pw - 2) x = px - 9 - tw;
    for (int tries = 0; tries < 12; ++tries) {
      const bool clash = std::any_of(used.begin(), used.end(), [&](const Box& b) {
        return x < b.x1 && x + tw > b.x0 && y < b.y1 && y + kFontSize > b.y0;
      });
      if (!clash) break;
      y += kFontSize + 1;
    }
    used.push_back({x - 1, y - 1, x + tw + 1, y + kFontSize});
    svg << "<g class=\"series\" fill=\"" << color << "\">\n<circle cx=\"" << px << "\" cy=\"" << py << "\" r=\"5\"/>\n";
    text(x, y + kFontSize - 2, pts[i].label, "start");
    svg << "</g>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace microscale::cli
