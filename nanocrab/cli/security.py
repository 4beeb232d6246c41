"""``nanocrab security nats-config`` (the broker permissions for a NATS server or cluster) and
``nanocrab security observer`` (a read-only identity for an outside client)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from nanocrab.cli.common import JsonOpt, app, console, err, settings_or_exit

security_app = typer.Typer(help="Identities and broker permissions.", no_args_is_help=True)
app.add_typer(security_app, name="security")


@security_app.command("nats-config")
def nats_config(json_: JsonOpt = False) -> None:
    """Print the nats-server `authorization` block for this data dir's identities (creating
    missing keys), and where each secret seed lives. Include it in every cluster node's
    config; see docs/security.md."""
    from nanocrab.bus import BusError
    from nanocrab.bus.permissions import IDENTITIES, MAY_PUBLISH, auth_config, publish_allow
    from nanocrab.cli.host import public_keys
    from nanocrab.cli.observers import observer_keys
    from nanocrab.cli.render import print_json
    from nanocrab.security import KeyRing

    settings = settings_or_exit()
    cfg = settings.bus()
    keyring = KeyRing(settings.keys_dir)
    try:
        keys = public_keys(keyring)
    except BusError as exc:
        err.print(f"[bold red]key error:[/] {exc}")
        raise typer.Exit(1) from exc
    block = auth_config(keys, cfg, observers=observer_keys(keyring.dir))
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


@security_app.command("observer")
def observer(
    name: Annotated[str, typer.Argument(help="lower-case letters, digits, - and _")],
    print_seed: Annotated[
        bool,
        typer.Option(
            "--print-seed",
            help="Print the secret seed once instead of keeping it in the keys directory.",
        ),
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Create a read-only NATS identity for an outside client: it may read the log (ordered
    consumers, direct gets, and one durable consumer named NAME) and publish nothing. The
    running embedded server takes it at once; `nanocrab up` keeps it on restart. Prints how to
    connect; see docs/events.md."""
    from nanocrab.bus import EmbeddedServer, ServerStartError
    from nanocrab.cli.host import server_authorization
    from nanocrab.cli.observers import (
        connect_snippets,
        create_observer,
        find_observer,
        observers_dir,
    )
    from nanocrab.cli.render import print_json
    from nanocrab.security import KeyRing

    settings = settings_or_exit()
    cfg = settings.bus()
    keyring = KeyRing(settings.keys_dir)
    if find_observer(keyring.dir, name) is not None:
        err.print(
            f"[bold red]error:[/] observer {name!r} exists already (its public key: "
            f"{observers_dir(keyring.dir) / (name + '.pub')}); remove {name}.pub and {name}.nk "
            "there to revoke it"
        )
        raise typer.Exit(1)
    try:
        made, seed = create_observer(keyring.dir, name, keep_seed=not print_seed)
    except ValueError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    url, live = settings.nats_url, "external"
    if url is None:
        server = EmbeddedServer(settings.home, authorization=server_authorization(keyring, cfg))
        try:
            live = "reloaded" if server.reload_authorization() else "not running"
        except ServerStartError as exc:
            err.print(f"[bold red]server error:[/] {exc}")
            raise typer.Exit(1) from exc
        state = server.running()
        url = str(state["url"]) if state else None
    seed_file = str(made.seed_path) if made.seed_path else "observer.nk"
    snippets = connect_snippets(url or "nats://127.0.0.1:4222", seed_file)
    if json_:
        print_json(
            console,
            {
                "name": made.name,
                "public_key": made.public_key,
                "seed_file": str(made.seed_path) if made.seed_path else None,
                "seed": seed.decode() if print_seed else None,
                "url": url,
                "server": live,
                "durable": made.name,
                "connect": snippets,
            },
        )
        return
    lines = [f"observer {made.name}: {made.public_key}"]
    if print_seed:
        lines += [
            "seed (shown once, not stored; save it as observer.nk, mode 0600):",
            f"  {seed.decode()}",
        ]
    else:
        lines.append(f"seed file: {made.seed_path} (0600; give it only to that client)")
    if live == "external":
        lines.append(
            f"server: {url} (external) — add the observer to every node: "
            "`nanocrab security nats-config` prints the new authorization block"
        )
    elif url is None:
        lines.append(
            "server: not running — `nanocrab up` includes the observer; `nanocrab status` "
            "prints its URL (4222 unless taken, then a free port)"
        )
    else:
        lines.append(f"server: {url} (the running server took the observer; no restart)")
    lines += [
        f"may: read every stream, create ordered consumers and one durable named {made.name!r};"
        " publish nothing",
        "connect:",
        *(f"  {lang:<10} {line}" for lang, line in snippets.items()),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
