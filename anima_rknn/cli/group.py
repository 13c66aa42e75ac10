"""The `anima-rknn` click group, which every command module registers itself on."""

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="anima-rknn")
def cli() -> None:
    """Anima text-to-image on small machines: CPU (PyTorch, ONNX Runtime) and the RK3588 NPU."""
