// A labelled scatter plot written as PNG, with no library: a small palette image, a built-in
// 5x7 pixel font, and stored (uncompressed) deflate blocks, so the CLI needs neither zlib nor
// Python to draw its figure.
#pragma once

#include <string>
#include <vector>

namespace microscale::cli {

struct PlotPoint {
  double x = 0, y = 0;
  std::string label;
};

// The PNG file's bytes. y is drawn on a log10 axis (relative errors span decades); points with
// y <= 0 or a non-finite coordinate are skipped.
std::vector<unsigned char> scatter_png(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                                       const std::vector<PlotPoint>& points);

// The raw encoder: `pixels` holds w*h palette indices (0..15), row-major; palette is 16 RGB triples.
std::vector<unsigned char> encode_png_palette4(int w, int h, const std::vector<unsigned char>& pixels,
                                               const unsigned char (&palette)[16][3]);

}  // namespace microscale::cli
