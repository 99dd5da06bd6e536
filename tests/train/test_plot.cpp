#include "train/plot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/error_testing.h"

namespace ham {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

// A fresh directory under the system temp dir, removed at the end of the test.
class PlotDir {
 public:
  explicit PlotDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("ham_test_plot_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
  }
  ~PlotDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Sets PATH for the scope (restored after).
class ScopedPath {
 public:
  explicit ScopedPath(const char* value) {
    const char* old = std::getenv("PATH");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("PATH", value, 1);
  }
  ~ScopedPath() {
    if (had_) {
      setenv("PATH", old_.c_str(), 1);
    } else {
      unsetenv("PATH");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Two panels: a sine and its impulses on a shaded span, and a log-y decay.
PlotFigure two_panel_figure() {
  std::vector<double> x, wave, decay;
  for (int i = 0; i < 50; ++i) {
    x.push_back(i);
    wave.push_back(std::sin(0.2 * i));
    decay.push_back(std::exp(-0.1 * i));
  }
  PlotFigure fig;
  fig.title = "test figure: it's quoted";
  PlotPanel a;
  a.title = "wave";
  a.x_label = "t";
  a.y_label = "sin";
  a.series.push_back(make_series("sin, with comma", x, wave));
  PlotSeries marks = make_series("marks", {10, 20}, {1, 1}, PlotStyle::Impulses);
  marks.color = "#d62728";
  marks.dashed = true;
  a.series.push_back(marks);
  a.spans.push_back({12.5, 17.5, "needle", "#f6b7b7"});
  PlotPanel b;
  b.title = "decay";
  b.log_y = true;
  b.series.push_back(make_series("exp", x, decay, PlotStyle::Points));
  fig.panels = {a, b};
  return fig;
}

TEST(Plot, WritesPngCsvAndScript) {
  PlotDir dir("writes");
  PlotFigure fig = two_panel_figure();
  PlotFiles files = write_plot(fig, dir.file("sub/figure.png"));
  EXPECT_EQ(files.png, dir.file("sub/figure.png"));
  EXPECT_EQ(files.csv, dir.file("sub/figure.csv"));
  EXPECT_EQ(files.script, dir.file("sub/figure.gp"));
  EXPECT_TRUE(is_png_file(files.png));
  EXPECT_GT(fs::file_size(files.png), 1000u);

  // Every point is one CSV row, labelled by panel and series; commas in labels are removed.
  std::vector<std::string> rows = lines_of(files.csv);
  ASSERT_EQ(rows.size(), size_t(1 + 50 + 2 + 50));
  EXPECT_EQ(rows[0], "panel,series,label,x,y");
  EXPECT_EQ(rows[1], "0,0,sin  with comma,0,0");
  EXPECT_EQ(rows[51], "0,1,marks,10,1");
  EXPECT_EQ(rows[53], "1,0,exp,0,1");

  // The script reads the CSV by its relative name, so it reruns in its directory.
  std::ifstream script(files.script);
  std::stringstream text;
  text << script.rdbuf();
  EXPECT_NE(text.str().find("'figure.csv'"), std::string::npos);
  EXPECT_NE(text.str().find("set output 'figure.png'"), std::string::npos);
  EXPECT_NE(text.str().find("set logscale y"), std::string::npos);
  EXPECT_NE(text.str().find("it''s quoted"), std::string::npos);
}

TEST(Plot, RewritingReplacesThePng) {
  PlotDir dir("rewrite");
  PlotFigure fig = two_panel_figure();
  write_plot(fig, dir.file("figure.png"));
  fig.panels.pop_back();
  PlotFiles files = write_plot(fig, dir.file("figure.png"));
  EXPECT_TRUE(is_png_file(files.png));
  EXPECT_EQ(lines_of(files.csv).size(), size_t(1 + 50 + 2));
}

TEST(Plot, NanValuesLeaveGaps) {
  PlotDir dir("nan");
  PlotFigure fig;
  fig.panels.push_back({});
  fig.panels[0].series.push_back(make_series("gappy", {0, 1, 2, 3}, {1, NAN, 2, 3}));
  PlotFiles files = write_plot(fig, dir.file("gaps.png"));
  EXPECT_TRUE(is_png_file(files.png));
  EXPECT_EQ(lines_of(files.csv)[2], "0,0,gappy,1,nan");
}

TEST(Plot, IsPngFileChecksTheSignature) {
  PlotDir dir("signature");
  fs::create_directories(fs::path(dir.file("x")).parent_path());
  std::ofstream(dir.file("fake.png")) << "not a png";
  EXPECT_FALSE(is_png_file(dir.file("fake.png")));
  EXPECT_FALSE(is_png_file(dir.file("missing.png")));
}

TEST(Plot, BadFiguresAreNamed) {
  PlotFigure good = two_panel_figure();
  const std::string png = "/tmp/ham_never_written.png";

  expect_error([&] { write_plot(good, "/tmp/figure.svg"); }, {"plot", "figure.svg", ".png"});
  expect_error([&] { write_plot(PlotFigure{}, png); }, {"plot", png, "no panels"});

  PlotFigure mismatched = good;
  mismatched.panels[1].series[0].y.pop_back();
  expect_error([&] { write_plot(mismatched, png); },
               {png, "panel 1 ('decay')", "series 0 ('exp')", "x has 50 values but y has 49"});

  PlotFigure empty_series = good;
  empty_series.panels[0].series[1].x.clear();
  empty_series.panels[0].series[1].y.clear();
  expect_error([&] { write_plot(empty_series, png); }, {"panel 0 ('wave')", "series 1 ('marks')", "no points"});

  PlotFigure no_series = good;
  no_series.panels[1].series.clear();
  expect_error([&] { write_plot(no_series, png); }, {"panel 1 ('decay')", "has no series"});

  PlotFigure log_zero = good;
  log_zero.panels[1].series[0].y[3] = 0.0;
  expect_error([&] { write_plot(log_zero, png); }, {"panel 1", "y[3] = 0", "log y axis"});

  PlotFigure bad_span = good;
  bad_span.panels[0].spans[0] = {5, 2, "", "red"};
  expect_error([&] { write_plot(bad_span, png); }, {"panel 0", "span 0", "from <= to", "5 .. 2"});

  PlotFigure bad_range = good;
  bad_range.panels[0].y_min = 1.0;
  bad_range.panels[0].y_max = 0.0;
  expect_error([&] { write_plot(bad_range, png); }, {"panel 0", "y range", "min < max"});

  PlotFigure no_columns = good;
  no_columns.columns = 0;
  expect_error([&] { write_plot(no_columns, png); }, {png, "columns", ">= 1"});
  EXPECT_FALSE(fs::exists(png));
}

TEST(Plot, GnuplotErrorIsOneLineNamingTheScript) {
  PlotDir dir("gnuplot_error");
  PlotFigure fig = two_panel_figure();
  fig.panels[0].series[0].color = "no-such-colour";
  expect_error([&] { write_plot(fig, dir.file("bad.png")); },
               {"bad.gp", "gnuplot exited with status 1", "unrecognized color name"});
}

TEST(Plot, MissingGnuplotSaysHowToInstallIt) {
  PlotDir dir("missing");
  ScopedPath empty_path("/nonexistent-ham-test-dir");
  EXPECT_EQ(find_gnuplot(), "");
  expect_error([&] { write_plot(two_panel_figure(), dir.file("figure.png")); },
               {"figure.png", "gnuplot is not installed", "scripts/install_deps.sh"});
}

}  // namespace
}  // namespace ham
