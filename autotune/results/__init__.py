"""What a study leaves behind: best.json, trials.csv, report.md and the charts."""
