"""The settings: what a study is asked to run (`config`: BenchConfig, its runs and its command-line
options; `presets`: named settings such as the paper's)."""
