"""The `tidemq` command."""

from __future__ import annotations

import click

from tidemq import __version__
from tidemq.cli.admin import admin_group
from tidemq.cli.messages import consume_cmd, send_cmd
from tidemq.cli.servers import broker_cmd, local_cmd, namesrv_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tidemq")
def cli() -> None:
    """TideMQ: a RocketMQ-compatible message queue for Kubernetes."""


cli.add_command(namesrv_cmd)
cli.add_command(broker_cmd)
cli.add_command(local_cmd)
cli.add_command(admin_group)
cli.add_command(send_cmd)
cli.add_command(consume_cmd)


def main() -> None:
    cli(prog_name="tidemq")


if __name__ == "__main__":
    main()
