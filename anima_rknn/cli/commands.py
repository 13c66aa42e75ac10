"""Every command of `anima-rknn`: its name, the module (of cli/) that defines it, and its one-line help.

The group (group.py) imports a command's module only when that command runs, and lists the commands from here
without importing any of them; tests/cli/test_lazy_cli.py checks each line against the command's own help.
"""

COMMANDS: dict[str, tuple[str, str]] = {
    "batch": ("batch", "Generate every job of JOBS into --out: a .jsonl file (one job's settings per..."),
    "bench": ("bench", 'Cached vs uncached baseline with the same weights, seed and noise: speed,...'),
    "calibrate-cache": ("calibrate_cache", "Fit this model's numbers for `--cache auto` (its budget, check, verify and..."),
    "convert-rknn": ("rknn", 'Compile every ONNX subgraph to fp16 .rknn, or w8a8 where it holds (needs...'),
    "doctor": ("doctor", "One line per check of what the board needs: the NPU, librknnrt against the..."),
    "eval-demo": ("eval_demo", 'Score how well the demo model follows its prompts (background, shape colour,...'),
    "export-onnx": ("export_onnx", "Export the DiT's attention and MLP bodies (3 per block) as ONNX subgraphs for..."),
    "export-vae": ("export_vae", 'Export the VAE decoder (and encoder) for one tile size (latent...'),
    "generate": ("generate", 'Generate one image (or --batch-count of them).'),
    "make-tiny": ("make_tiny", 'Write a random-weight model set in the real file formats and the Hugging Face...'),
    "plan": ("rknn", 'Predict peak memory and load/release traffic per pass of the rknn backend;...'),
    "quantize": ("quantize", 'Write SOURCE (a DiT, text encoder or VAE; safetensors or GGUF) as a quantized...'),
    "serve": ("serve", 'Serve the model over HTTP until Ctrl-C; a job running then resumes at the...'),
    "train-demo": ("train_demo", 'Train the demo model set (about 35 minutes on 2 cores).'),
    "train-demo-lora": ("train_demo", 'Train the demo LoRA: "large" shapes, a word the demo model never learned.'),
    "verify-rknn": ("rknn", 'Accuracy of every converted subgraph against fp32 torch, on the inputs of a...'),
}
