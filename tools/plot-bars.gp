# SPDX-License-Identifier: MIT
# plot-bars.gp - clustered bars for docs/benchmarks.md, called by tools/bench-report.py:
#   gnuplot -e "data='x.dat'; out='x.png'; ttl='...'; ylab='...'; ncols=N; logy=0|1" plot-bars.gp
# data: a header line of quoted column titles, then one line per cluster: a quoted label and
# N-1 values (NaN where a system was not measured).
set terminal pngcairo size 960,480 font "sans,10"
set output out
set title ttl
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
