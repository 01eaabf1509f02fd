# SPDX-License-Identifier: MIT
# plot-bars.gp - clustered bars for the benchmark report, called by tools/bench-report.py:
#   gnuplot -e "data='x.dat'; out='x.png'; ttl='...'; stamp='...'; ylab='...'; ncols=N;
#               logy=0|1" plot-bars.gp
# data: a header line of quoted column titles, then one line per cluster: a quoted label and
# N-1 values (NaN where a system was not measured). stamp: the run's date, machine and command,
# printed under the title; a plot without one is refused, since a figure without its date and
# machine cannot be read.
if (!exists("stamp") || strlen(stamp) == 0) {
	print "plot-bars.gp: stamp (the run's date and machine) is required"
	exit status 2
}
set terminal pngcairo size 960,520 font "sans,10"
set output out
set title ttl . "\n" . stamp noenhanced
set ylabel ylab
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside right top
set grid ytics
set xtics nomirror rotate by -25
set datafile missing "NaN"
if (logy) {
	set logscale y
} else {
	set yrange [0:*]
}
plot for [i=2:ncols] data using i:xtic(1) title columnheader(i)
