#include "train/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"

namespace ham {

namespace fs = std::filesystem;

namespace {

// A gnuplot single-quoted string: no escapes inside except '' for a quote; one line.
std::string gnuplot_string(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "''";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "'";
}

// A CSV field that never needs quoting: commas, quotes and line breaks become spaces.
std::string plain_csv_field(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    if (c == ',' || c == '"' || c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

// Shortest text that reads back as the same double; "nan" / "inf" for the rest (gnuplot
// treats both as undefined points).
std::string number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", value);
}

std::string style_clause(const PlotSeries& s) {
  std::string clause;
  switch (s.style) {
    case PlotStyle::Lines: clause = fmt::format("with lines lw {}", s.width); break;
    case PlotStyle::Points: clause = fmt::format("with points pt 7 ps {}", s.width * 0.4); break;
    case PlotStyle::LinesPoints:
      clause = fmt::format("with linespoints lw {} pt 7 ps 0.5", s.width);
      break;
    case PlotStyle::Impulses: clause = fmt::format("with impulses lw {}", s.width); break;
    case PlotStyle::Steps: clause = fmt::format("with steps lw {}", s.width); break;
  }
  if (!s.color.empty()) clause += " lc rgb " + gnuplot_string(s.color);
  if (s.dashed) clause += " dt 2";
  clause += s.label.empty() ? " notitle" : " title " + gnuplot_string(s.label);
  return clause;
}

std::string panel_name(const PlotPanel& panel, size_t index) {
  return panel.title.empty() ? fmt::format("panel {}", index)
                             : fmt::format("panel {} ('{}')", index, panel.title);
}

std::string series_name(const PlotSeries& series, size_t index) {
  return series.label.empty() ? fmt::format("series {}", index)
                              : fmt::format("series {} ('{}')", index, series.label);
}

std::string axis_range(const std::optional<double>& low, const std::optional<double>& high) {
  return fmt::format("[{}:{}]", low ? number(*low) : "*", high ? number(*high) : "*");
}

// The script: one multiplot cell per panel, every series filtered out of the shared CSV
// by its (panel, series) numbers.
std::string gnuplot_script(const PlotFigure& figure, const std::string& csv_name,
                           const std::string& png_name) {
  int64_t columns = std::min<int64_t>(figure.columns, int64_t(figure.panels.size()));
  int64_t rows = (int64_t(figure.panels.size()) + columns - 1) / columns;
  std::ostringstream gp;
  gp << "# Written by ham (train/plot.cpp); reads " << csv_name << ". Rerun: gnuplot "
     << fs::path(png_name).stem().string() << ".gp\n";
  gp << fmt::format("set terminal pngcairo size {},{} noenhanced font ',10'\n", figure.width,
                    rows * figure.panel_height + (figure.title.empty() ? 0 : 30));
  gp << "set output " << gnuplot_string(png_name) << "\n";
  gp << "set datafile separator ','\n";
  gp << "set key outside right top\n";
  gp << "set grid back lc rgb '#e6e6e6'\n";
  gp << fmt::format("set multiplot layout {},{} rowsfirst", rows, columns);
  if (!figure.title.empty()) gp << " title " << gnuplot_string(figure.title);
  gp << "\n";
  for (size_t p = 0; p < figure.panels.size(); ++p) {
    const PlotPanel& panel = figure.panels[p];
    gp << "\n# " << panel_name(panel, p) << "\n";
    gp << "unset object\nunset label\nunset logscale\n";
    gp << "set title " << gnuplot_string(panel.title) << "\n";
    gp << "set xlabel " << gnuplot_string(panel.x_label) << "\n";
    gp << "set ylabel " << gnuplot_string(panel.y_label) << "\n";
    if (panel.log_x) gp << "set logscale x\n";
    if (panel.log_y) gp << "set logscale y\n";
    gp << "set xrange " << axis_range(panel.x_min, panel.x_max) << "\n";
    gp << "set yrange " << axis_range(panel.y_min, panel.y_max) << "\n";
    for (size_t s = 0; s < panel.spans.size(); ++s) {
      const PlotSpan& span = panel.spans[s];
      gp << fmt::format("set object {} rect from {}, graph 0 to {}, graph 1 behind fillcolor rgb "
                        "{} fillstyle solid 0.6 noborder\n",
                        s + 1, number(span.from), number(span.to), gnuplot_string(span.color));
      if (!span.label.empty()) {
        gp << fmt::format("set label {} {} at {}, graph 0.93 front\n", s + 1,
                          gnuplot_string(span.label), number(span.from));
      }
    }
    gp << "plot ";
    for (size_t s = 0; s < panel.series.size(); ++s) {
      if (s > 0) gp << ", \\\n     ";
      gp << (s == 0 ? gnuplot_string(csv_name) : std::string("''"))
         << fmt::format(" skip 1 using 4:(($1 == {} && $2 == {}) ? $5 : NaN) ", p, s)
         << style_clause(panel.series[s]);
    }
    gp << "\n";
  }
  gp << "unset multiplot\n";
  return gp.str();
}

// Runs `command` through the shell; returns its exit status and its output (stdout and
// stderr together).
std::pair<int, std::string> run_capturing(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  HAM_CHECK(pipe != nullptr, "plot: cannot start '", command, "'");
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = pclose(pipe);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return {code, output};
}

// A shell word: single-quoted, with embedded quotes closed and reopened.
std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// gnuplot's last non-empty output line: the error ("name.gp" line N: ...) follows the
// echoed command and its caret.
std::string last_line(const std::string& output) {
  std::istringstream in(output);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  size_t start = last.find_first_not_of(" \t");
  return start == std::string::npos ? std::string("(no output)") : last.substr(start);
}

}  // namespace

PlotSeries make_series(std::string label, std::vector<double> x, std::vector<double> y,
                       PlotStyle style) {
  PlotSeries s;
  s.label = std::move(label);
  s.x = std::move(x);
  s.y = std::move(y);
  s.style = style;
  return s;
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    fs::path candidate = fs::path(dir) / "gnuplot";
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && access(candidate.c_str(), X_OK) == 0) {
      return candidate.string();
    }
  }
  return "";
}

bool is_png_file(const std::string& path) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  unsigned char head[8] = {};
  in.read(reinterpret_cast<char*>(head), 8);
  if (in.gcount() != 8) return false;
  for (int i = 0; i < 8; ++i) {
    if (head[i] != kSignature[i]) return false;
  }
  return true;
}

void validate_plot(const PlotFigure& figure, const std::string& png_path) {
  const std::string& where = png_path;
  HAM_CHECK(fs::path(png_path).extension() == ".png", "plot ", where,
            ": the output file must end in .png");
  HAM_CHECK(!figure.panels.empty(), "plot ", where, ": the figure has no panels");
  HAM_CHECK(figure.columns >= 1, "plot ", where, ": columns must be >= 1, got ", figure.columns);
  HAM_CHECK(figure.width >= 100 && figure.panel_height >= 50, "plot ", where,
            ": the size must be at least 100 x 50 pixels per panel, got width ", figure.width,
            " and panel_height ", figure.panel_height);
  for (size_t p = 0; p < figure.panels.size(); ++p) {
    const PlotPanel& panel = figure.panels[p];
    std::string pname = panel_name(panel, p);
    HAM_CHECK(!panel.series.empty(), "plot ", where, ": ", pname, " has no series");
    for (size_t s = 0; s < panel.series.size(); ++s) {
      const PlotSeries& series = panel.series[s];
      std::string sname = series_name(series, s);
      HAM_CHECK(series.x.size() == series.y.size(), "plot ", where, ": ", pname, " ", sname,
                ": x has ", series.x.size(), " values but y has ", series.y.size());
      HAM_CHECK(!series.x.empty(), "plot ", where, ": ", pname, " ", sname, " has no points");
      HAM_CHECK(std::isfinite(series.width) && series.width > 0, "plot ", where, ": ", pname, " ",
                sname, ": width must be > 0, got ", series.width);
      for (size_t i = 0; i < series.x.size(); ++i) {
        HAM_CHECK(!panel.log_x || !std::isfinite(series.x[i]) || series.x[i] > 0, "plot ", where,
                  ": ", pname, " ", sname, ": x[", i, "] = ", series.x[i],
                  " is not > 0 on a log x axis");
        HAM_CHECK(!panel.log_y || !std::isfinite(series.y[i]) || series.y[i] > 0, "plot ", where,
                  ": ", pname, " ", sname, ": y[", i, "] = ", series.y[i],
                  " is not > 0 on a log y axis");
      }
    }
    for (size_t s = 0; s < panel.spans.size(); ++s) {
      const PlotSpan& span = panel.spans[s];
      HAM_CHECK(std::isfinite(span.from) && std::isfinite(span.to) && span.from <= span.to,
                "plot ", where, ": ", pname, " span ", s, ": needs finite from <= to, got ",
                span.from, " .. ", span.to);
    }
    auto check_range = [&](const std::optional<double>& low, const std::optional<double>& high,
                           const char* axis) {
      HAM_CHECK(!low || !high || *low < *high, "plot ", where, ": ", pname, ": ", axis,
                " range must have min < max, got ", *low, " .. ", *high);
    };
    check_range(panel.x_min, panel.x_max, "x");
    check_range(panel.y_min, panel.y_max, "y");
  }
}

PlotFiles write_plot(const PlotFigure& figure, const std::string& png_path) {
  validate_plot(figure, png_path);
  std::string gnuplot = find_gnuplot();
  HAM_CHECK(!gnuplot.empty(), "plot ", png_path,
            ": gnuplot is not installed (not found on PATH); run scripts/install_deps.sh");

  fs::path png = fs::path(png_path);
  fs::path dir = png.has_parent_path() ? png.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  HAM_CHECK(fs::is_directory(dir), "plot ", png_path, ": cannot create directory ", dir.string());
  std::string stem = png.stem().string();
  PlotFiles files{png.string(), (dir / (stem + ".csv")).string(), (dir / (stem + ".gp")).string()};

  {
    std::ofstream csv(files.csv);
    HAM_CHECK(csv, files.csv, ": cannot write the plot data");
    csv << "panel,series,label,x,y\n";
    for (size_t p = 0; p < figure.panels.size(); ++p) {
      for (size_t s = 0; s < figure.panels[p].series.size(); ++s) {
        const PlotSeries& series = figure.panels[p].series[s];
        std::string label = plain_csv_field(series.label);
        for (size_t i = 0; i < series.x.size(); ++i) {
          csv << p << ',' << s << ',' << label << ',' << number(series.x[i]) << ','
              << number(series.y[i]) << '\n';
        }
      }
    }
    HAM_CHECK(csv.good(), files.csv, ": writing the plot data failed");
  }
  {
    std::ofstream gp(files.script);
    HAM_CHECK(gp, files.script, ": cannot write the gnuplot script");
    gp << gnuplot_script(figure, stem + ".csv", png.filename().string());
    HAM_CHECK(gp.good(), files.script, ": writing the gnuplot script failed");
  }

  fs::remove(png, ec);  // so that a PNG found afterwards is this run's
  auto [code, output] = run_capturing("cd " + shell_quote(dir.string()) + " && " +
                                      shell_quote(gnuplot) + " " + shell_quote(stem + ".gp"));
  HAM_CHECK(code == 0, "plot ", files.script, ": gnuplot exited with status ", code, ": ",
            last_line(output));
  HAM_CHECK(is_png_file(files.png), "plot ", files.script, ": gnuplot exited 0 but ", files.png,
            " is missing or not a PNG");
  return files;
}

}  // namespace ham
