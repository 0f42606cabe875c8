"""`blazar tune`: measure a model's settings on real children and keep the best as its
profile (docs/tune.md). `workloads` ships the requests, `plan` says which runs to make,
`measure` starts the children and times them, `race` decides, `session` records."""
