"""`anima-rknn serve`: the HTTP APIs over one job queue (job_queue.py, over the job store store.py, the uploads
store uploads.py and the worker worker.py) and its runtime (runtime.py), one routes module per API family: a1111.py
(AUTOMATIC1111's /sdapi/v1), openai.py (OpenAI's /v1/images), native.py (/api/jobs and compare with baseline),
page.py (the web page at /); app.py builds the one app of them all."""
