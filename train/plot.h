#pragma once
// Line plots rendered to PNG by gnuplot (Debian package gnuplot-nox, installed by
// scripts/install_deps.sh). A figure is one or more panels laid out in a grid; a panel
// holds series of (x, y) points drawn as lines, points or impulses, shaded x-ranges (a
// needle's tokens) and optional log axes.
//
// write_plot(figure, "dir/name.png") writes three files next to each other:
//   name.csv  every plotted point: panel,series,label,x,y (one row per point)
//   name.gp   the gnuplot script, which reads name.csv (rerun it in dir: gnuplot name.gp)
//   name.png  the image
// and checks gnuplot's exit status and that the PNG was written. Without gnuplot it fails
// with one line saying to run scripts/install_deps.sh; there is no fallback renderer.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ham {

enum class PlotStyle { Lines, Points, LinesPoints, Impulses, Steps };

struct PlotSeries {
  std::string label;  // legend entry; "" leaves it out of the legend
  std::vector<double> x, y;  // same length, at least one point; NaN y leaves a gap
  PlotStyle style = PlotStyle::Lines;
  std::string color;   // a gnuplot colour ("red", "#1f77b4"); "" takes the next default
  double width = 1.5;  // line width (point size for Points)
  bool dashed = false;
};

// A series with the default look (lines, the next colour, width 1.5).
PlotSeries make_series(std::string label, std::vector<double> x, std::vector<double> y,
                       PlotStyle style = PlotStyle::Lines);

// A shaded band over the whole panel height between x = from and x = to.
struct PlotSpan {
  double from = 0, to = 0;
  std::string label;  // written at the band's top left; "" for none
  std::string color = "#f6b7b7";
};

struct PlotPanel {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
  std::vector<PlotSpan> spans;
  bool log_x = false, log_y = false;  // every finite value on a log axis must be > 0
  std::optional<double> y_min, y_max;  // unset: autoscale
  std::optional<double> x_min, x_max;
};

struct PlotFigure {
  std::string title;  // above all panels
  std::vector<PlotPanel> panels;
  int64_t columns = 1;         // panels fill a grid of this many columns, row by row
  int64_t width = 1100;        // pixels
  int64_t panel_height = 300;  // pixels per grid row
};

struct PlotFiles {
  std::string png, csv, script;
};

// Checks the figure (one-line errors naming the PNG, the panel and the series at fault),
// writes the CSV and the script, runs gnuplot and checks the PNG. Creates the directory.
PlotFiles write_plot(const PlotFigure& figure, const std::string& png_path);

// Throws the error write_plot would for a figure it cannot draw; `png_path` names it.
void validate_plot(const PlotFigure& figure, const std::string& png_path);

// The gnuplot executable on PATH, or "" when there is none.
std::string find_gnuplot();

// True when `path` is a file that starts with the 8-byte PNG signature.
bool is_png_file(const std::string& path);

}  // namespace ham
