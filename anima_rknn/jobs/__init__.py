"""The one job runner every front end that runs jobs drives: `serve`'s queue, `batch`'s local and Ray workers and
`generate` itself (runner.JobRunner)."""
