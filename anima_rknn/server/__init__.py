"""`anima-rknn serve`: the HTTP APIs (AUTOMATIC1111, OpenAI, native jobs) over one job queue."""
