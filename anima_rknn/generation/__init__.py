"""The generation layer under every front end: the settings and their option table (params), the pipeline that
runs them, resume states, and the one result record and publisher (result)."""
