"""``nanocrab security nats-config``: the broker permissions for a NATS server or cluster."""

from __future__ import annotations

import sys

import typer

from nanocrab.bus import BusError
from nanocrab.bus.permissions import IDENTITIES, MAY_PUBLISH, auth_config, publish_allow
from nanocrab.cli.common import JsonOpt, app, console, err, settings_or_exit
from nanocrab.cli.host import public_keys
from nanocrab.cli.render import print_json
from nanocrab.security import KeyRing

security_app = typer.Typer(help="Identities and broker permissions.", no_args_is_help=True)
app.add_typer(security_app, name="security")


@security_app.command("nats-config")
def nats_config(json_: JsonOpt = False) -> None:
    """Print the nats-server `authorization` block for this data dir's identities (creating
    missing keys), and where each secret seed lives. Include it in every cluster node's
    config; see docs/security.md."""
    settings = settings_or_exit()
    cfg = settings.bus()
    keyring = KeyRing(settings.keys_dir)
    try:
        keys = public_keys(keyring)
    except BusError as exc:
        err.print(f"[bold red]key error:[/] {exc}")
        raise typer.Exit(1) from exc
    block = auth_config(keys, cfg)
    if json_:
        print_json(
            console,
            {
                "root": cfg.root,
                "identities": [
                    {
                        "name": name,
                        "public_key": keys[name],
                        "seed": str(keyring.seed_path(name)),
                        "may_publish": [">"] if name == "admin" else list(MAY_PUBLISH[name]),
                        "publish_subjects": publish_allow(name, cfg),
                    }
                    for name in IDENTITIES
                ],
                "config": block,
            },
        )
        return
    width = max(len(n) for n in IDENTITIES)
    lines = [
        f"# nanocrab broker permissions for subject root {cfg.root!r} "
        "(`nanocrab security nats-config`).",
        "# Include in every node's nats-server config, e.g. `include nanocrab-auth.conf`.",
        "# Seeds are secret: give each process only the ones it connects as.",
        *(f"#   {name:<{width}}  {keyring.seed_path(name)}" for name in IDENTITIES),
        block,
    ]
    sys.stdout.write("\n".join(lines))
