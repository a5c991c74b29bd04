"""azctl: command-line front end of the azswap control plane."""

import click


@click.group()
def cli() -> None:
    """Control azswap: devices, sandboxes, templates, phases and policy."""


def main() -> None:
    cli()
