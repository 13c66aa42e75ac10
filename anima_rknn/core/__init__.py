"""Foundations every part uses: the one output module (files), safetensors I/O (tensorfile), memory, CPU speed."""
