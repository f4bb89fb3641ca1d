"""The `tidemq` command. Subcommands load on first use, so `tidemq admin ...` and `tidemq send`
do not pay for importing the broker, the store and the HTTP server."""

from __future__ import annotations

import importlib

import click

from tidemq import __version__

COMMANDS = {
    "namesrv": "tidemq.cli.servers:namesrv_cmd",
    "broker": "tidemq.cli.servers:broker_cmd",
    "local": "tidemq.cli.servers:local_cmd",
    "admin": "tidemq.cli.admin:admin_group",
    "send": "tidemq.cli.messages:send_cmd",
    "consume": "tidemq.cli.messages:consume_cmd",
    "operator": "tidemq.cli.operator:operator_cmd",
}


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from tidemq import compiled  # noqa: PLC0415 (imports the hot modules: only when asked)

    click.echo(f"tidemq, version {__version__}\nhot paths: {compiled.summary()}")
    ctx.exit()


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Show the version and whether the compiled extensions run, then exit.")
def cli() -> None:
    """TideMQ: a RocketMQ-compatible message queue for Kubernetes."""


def main() -> None:
    cli(prog_name="tidemq")


if __name__ == "__main__":
    main()
