// A labelled scatter plot written as SVG text: markers, labels, grid and axes are SVG elements,
// so the CLI draws its figure with neither an image library nor Python.
#pragma once

#include <string>
#include <vector>

namespace microscale::cli {

struct PlotPoint {
  double x = 0, y = 0;
  std::string label;
};

// The SVG document. y is drawn on a log10 axis (relative errors span decades); points with y <= 0
// or a non-finite coordinate are skipped. Each point drawn is one series, <g class="series">
// holding its marker (<circle>) and its label (<text>).
std::string scatter_svg(const std::string& title, const std::string& xlabel, const std::string& ylabel,
                        const std::vector<PlotPoint>& points);

}  // namespace microscale::cli
