"""`tictac ps`, `tictac server` and `tictac schedule install|clear|stats|trace`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from tictac_hooks import checks
from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S
from tictac_hooks.enforce.tf_config import (EXIT_RETRY, WILDCARD_HOSTS, NotResolvedError,
                                            cluster_from_tf_config, unexpanded_variable,
                                            wait_resolvable)
from tictac_hooks.graph.schedule import Schedule


def window_bytes_arg(text: str) -> int:
    """argparse type of the --window-bytes options."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes >= 0, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ps", help="run a PS task with the TicTac gate",
        description="Start this PS task's TensorFlow server with the TicTac gate. Native "
                    "backend (default): the gate runs inside the PS's gRPC server "
                    "(protocol grpc+tictac) on the address the cluster spec names. Proxy "
                    "backend: the TensorFlow server binds a private port and the HTTP/2 "
                    "rendezvous listens on the cluster-spec address in front of it.")
    _task_arguments(p)
    p.add_argument("--backend", choices=("native", "proxy"), default="native",
                   help="where the gate runs (default native; proxy: a sidecar for PS "
                        "images that cannot load the library)")
    p.add_argument("--private-port", type=checks.arg_port(zero_picks_one=True), default=0,
                   help="proxy: the TensorFlow server's own port, 1..65535 (default 0: a "
                        "free one)")
    p.add_argument("--bind-host", default=None,
                   help="where the PS listens. native: its one port (default: the host of "
                        "its cluster-spec address, waited for until it resolves); proxy: "
                        "the rendezvous (default 127.0.0.1). On Kubernetes give the pod IP "
                        "(--bind-host $(POD_IP)): a replica's name resolves only once its "
                        "pod is Ready. 0.0.0.0 serves every interface (warned: "
                        "TensorFlow's servers have no authentication)")
    p.add_argument("--resolve-timeout", type=checks.arg_seconds(), default=120.0,
                   metavar="SECONDS",
                   help="how long to wait for a bind host given as a name to resolve; "
                        f"then exit {EXIT_RETRY}, which Kubernetes' TFJob operator retries "
                        "(default 120; configuration errors exit 2, never retried)")
    checks.add_renamed_option(
        p, "--skip-timeout", "--skip-after", dest="skip_after",
        type=checks.arg_seconds(), default=DEFAULT_SKIP_AFTER_S, metavar="SECONDS",
        help="the skip bound, the same bound as --tictac_skip_timeout with the "
             "same default: skip a scheduled transfer that has not come this "
             "long after the last hand-back while later ones wait (default "
             f"{DEFAULT_SKIP_AFTER_S:g})")
    p.add_argument("--window-bytes", type=window_bytes_arg, default=None, metavar="BYTES",
                   help="proxy: look-ahead window: a scheduled transfer may go before the "
                        "one ahead of it is answered while at most this many bytes are in "
                        "flight (default 1048576; 0: strictly one at a time)")
    p.add_argument("--workers", type=checks.arg_whole_number(1), default=None, metavar="N",
                   help="the workers the gate's bounds are sized for: it keeps 64 step "
                        "records per worker between two reads and at most 256 live steps "
                        "per worker (default: the cluster spec's worker and chief tasks, "
                        "at least 64)")
    p.add_argument("--no-rendezvous", action="store_true",
                   help="run a plain TensorFlow server on the cluster-spec address")
    p.set_defaults(func=_ps, job="ps")

    p = sub.add_parser(
        "build", help="build the native gate for this TensorFlow (cached) and say where",
        description="Compile the native TicTac gate against the TensorFlow installed here "
                    "(once per TensorFlow, compiler and source version; cached per user) "
                    "and print where the library is and what it was built against.")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.set_defaults(func=_build)

    p = sub.add_parser(
        "server", help="run a plain TensorFlow server task (e.g. a worker)",
        description="Start a tf.distribute.Server for one task of the cluster and block.")
    _task_arguments(p)
    p.add_argument("--job", default="worker", help="job name (default worker)")
    p.add_argument("--load-native", action="store_true",
                   help="load the TicTac native library into this task first: its ops "
                        "(TictacDelay, the emulated compute of `tictac bench "
                        "--emulate-gpu`) then run here")
    p.set_defaults(func=_server)

    p = sub.add_parser(
        "schedule", help="install, clear or read the schedule at the PS gates",
        description="Talk to the TicTac gate of one or more PS tasks (either backend).")
    ssub = p.add_subparsers(dest="schedule_command", metavar="ACTION")
    ssub.required = True
    for name, help_text, func in (
            ("install", "install an order file on every --ps", _install),
            ("clear", "remove the schedule from every --ps", _clear),
            ("stats", "print per-step stats of every --ps as JSON", _stats),
            ("trace", "write the transfer timeline as Chrome/Perfetto trace JSON", _trace)):
        q = ssub.add_parser(name, help=help_text, description=help_text)
        q.add_argument("--ps", action="append", required=True, metavar="HOST:PORT",
                       type=checks.arg_address(),
                       help="a PS address from the cluster spec (repeat for every PS)")
        q.add_argument("--timeout", type=checks.arg_seconds(), default=10.0,
                       help="seconds per call, > 0 (default 10)")
        if name == "install":
            q.add_argument("order", metavar="ORDER.json",
                           help="order JSON {algorithm, order, priority} or name<TAB>priority lines")
            checks.add_renamed_option(
                q, "--skip-timeout", "--skip-after", dest="skip_after",
                type=checks.arg_seconds(), default=None, metavar="SECONDS",
                help="the PS's skip bound for this schedule, as --tictac_skip_timeout "
                     "(default: as the PS was started)")
            q.add_argument("--window-bytes", type=window_bytes_arg, default=None, metavar="BYTES",
                           help="the look-ahead window (default: as started; 0: strict)")
        if name == "trace":
            q.add_argument("--output", "-o", required=True, metavar="TRACE.json")
        q.set_defaults(func=func)


def _task_arguments(p: argparse.ArgumentParser) -> None:
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--cluster-spec", metavar="JSON",
                     help='cluster spec as JSON ({"ps": [...], "worker": [...]}) or a file')
    how.add_argument("--tf-config", nargs="?", const="", metavar="JSON",
                     help="read cluster and task from TF_CONFIG (or from this JSON)")
    p.add_argument("--task-index", type=checks.arg_whole_number(0), default=None,
                   help="this task's index in its job (default 0, or TF_CONFIG's)")


def _cluster(args: argparse.Namespace) -> tuple[dict, str, int]:
    """(cluster spec, job, task index) from --cluster-spec or TF_CONFIG, checked before
    TensorFlow is imported: a wrong spec fails fast, with a message, not a traceback."""
    if args.cluster_spec is not None:
        spec = _cluster_spec_arg(args.cluster_spec)
        if args.job not in spec:
            raise ValueError(f"--cluster-spec has no job {args.job!r}: {spec!r}")
        job, index = args.job, args.task_index or 0
    else:
        spec, job, index = cluster_from_tf_config(args.tf_config or None)
        if job != args.job:
            hint = ("start PS tasks with `tictac ps --tf-config`" if job == "ps" else
                    f"start this task with `tictac server --tf-config --job {job}`")
            raise ValueError(f"TF_CONFIG says this task is {job!r}, not {args.job!r}; "
                             f"{hint}, or fix TF_CONFIG's task.type")
        if args.task_index is not None:
            index = args.task_index
    tasks = spec.get(job)
    if isinstance(tasks, dict):  # sparse job {index: address}; JSON keys are strings
        try:
            tasks = spec[job] = {int(k): v for k, v in tasks.items()}
        except ValueError:
            tasks = {}
        known = index in tasks
    else:
        known = isinstance(tasks, (list, tuple)) and 0 <= index < len(tasks)
    if not known:
        raise ValueError(f"the cluster spec has no task {job}:{index}: {spec!r}; fix the "
                         "task index or the cluster")
    checks.cluster_addresses(spec)
    return spec, job, index


_SPEC_FORM = ('--cluster-spec must be a JSON object {job: [addresses]}, e.g. '
              '{"ps": ["host:2222"], "worker": ["host:2223"]}, or a path to a file holding one')


def _cluster_spec_arg(text: str) -> dict:
    """The cluster spec of --cluster-spec: inline JSON, or the path of a JSON file."""
    source = "--cluster-spec"
    if not text.lstrip().startswith(("{", "[", '"')) and os.path.isfile(text):
        source = f"--cluster-spec file {text!r}"
        with open(text) as f:
            text = f.read()
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        if source == "--cluster-spec" and not text.lstrip().startswith("{"):
            raise ValueError(f"{_SPEC_FORM}; {text!r} is not JSON, and no such file "
                             "exists") from None
        raise ValueError(f"{source} is not valid JSON: {e}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{_SPEC_FORM}; {source} holds a JSON {type(spec).__name__}: "
                         f"{spec!r}")
    for job, tasks in spec.items():
        if not isinstance(tasks, (list, dict)) or not tasks:
            raise ValueError(f"{_SPEC_FORM}; job {job!r} is {tasks!r}")
    return spec


def _own_port_free(spec: dict, job: str, index: int) -> None:
    """Before TensorFlow is imported: the port this task's server binds is free."""
    address = spec[job][index]
    checks.port_free(checks.address("address", address)[1],
                     f"{job}:{index}'s address {address} in the cluster spec")


def _wait_for_bind_host(args: argparse.Namespace, spec: dict, job: str, index: int) -> None:
    """Before TensorFlow is imported: --bind-host is usable (not empty, not a Kubernetes
    ``$(VAR)`` left unexpanded), and the host this PS binds resolves when it is a name
    (waited for: NotResolvedError after --resolve-timeout)."""
    if args.bind_host is not None:
        unexpanded_variable(args.bind_host, "--bind-host")
        if not args.bind_host.strip():
            raise ValueError("--bind-host is empty; give a host name or an address, e.g. "
                             "--bind-host $(POD_IP) on Kubernetes")
    if args.no_rendezvous:
        return  # a plain TensorFlow server binds every interface
    host = args.bind_host
    if host is None and args.backend == "native":
        host = checks.address("address", spec[job][index])[0]
    if host is not None and host not in WILDCARD_HOSTS:
        wait_resolvable(host, args.resolve_timeout, f"{job}:{index}")


def _ps(args: argparse.Namespace) -> int:
    spec, job, index = _cluster(args)
    try:
        _wait_for_bind_host(args, spec, job, index)
    except NotResolvedError as e:
        print(f"tictac ps: error: {e}", file=sys.stderr, flush=True)
        return EXIT_RETRY
    # The native (or plain) PS's server binds its cluster-spec port; the proxy's
    # TensorFlow server binds --private-port (the rendezvous says itself when the
    # cluster-spec port is taken).
    if args.no_rendezvous or args.backend == "native":
        _own_port_free(spec, job, index)
    elif args.private_port:
        checks.port_free(args.private_port, f"--private-port {args.private_port}")

    import tensorflow as tf

    from tictac_hooks.enforce.gate import Gate
    from tictac_hooks.enforce.server import TicTacServer, sized_workers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.no_rendezvous:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job,
                                      task_index=index, protocol="grpc")
        print(f"tictac ps: plain TensorFlow server {job}:{index} on "
              f"{spec[job][index]}", flush=True)
        server.join()
        return 0
    if args.bind_host in WILDCARD_HOSTS:
        print(f"tictac ps: warning: --bind-host {args.bind_host}: this PS accepts "
              "connections on every interface; TensorFlow's gRPC servers have no "
              "authentication, so anything that reaches the port can run ops here: keep it "
              "inside the cluster's network", file=sys.stderr, flush=True)
    if args.backend == "native":
        if args.private_port or args.window_bytes is not None:
            print("tictac ps: warning: --private-port and --window-bytes apply to "
                  "--backend proxy only; the native PS serves on its cluster-spec port",
                  file=sys.stderr, flush=True)
        server = TicTacServer(spec, job_name=job, task_index=index, backend="native",
                              skip_after_s=args.skip_after, bind_host=args.bind_host,
                              workers=args.workers)
        print(f"tictac ps: {job}:{index} native gate (grpc+tictac) on "
              f"{server.public_address} (listening on {server.listening} only)", flush=True)
        server.join()
        return 0
    server = TicTacServer(spec, job_name=job, task_index=index, backend="proxy",
                          private_port=args.private_port, bind_host=args.bind_host,
                          gate=Gate(skip_after_s=args.skip_after,
                                    workers=sized_workers(spec, args.workers), **(
                              {} if args.window_bytes is None
                              else {"window_bytes": args.window_bytes})))
    print(f"tictac ps: {job}:{index} rendezvous on {server.rendezvous.address}, "
          f"TensorFlow server on {server.private_address}", flush=True)
    private = server.private_address.rsplit(":", 1)[1]
    print(f"tictac ps: warning: the proxy's TensorFlow server listens on every interface "
          f"at port {private} (TensorFlow binds 0.0.0.0; only the native backend can "
          f"narrow it): firewall port {private}, or use --backend native",
          file=sys.stderr, flush=True)
    server.join()
    return 0


def _build(args: argparse.Namespace) -> int:
    from tictac_hooks.enforce.native.build import build

    info = build(force=args.force)
    print(f"tictac build: {'cached' if info.cached else f'built in {info.seconds:.0f} s'}: "
          f"{info.path} (TensorFlow {info.tf_version}, {info.compiler})", file=sys.stderr)
    print(json.dumps(info.to_json(), indent=1))
    return 0


def _server(args: argparse.Namespace) -> int:
    spec, job, index = _cluster(args)
    _own_port_free(spec, job, index)

    import tensorflow as tf

    if args.load_native:
        from tictac_hooks.enforce.native.build import load
        load()
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job,
                                  task_index=index, protocol="grpc")
    print(f"tictac server: {job}:{index} on {spec[job][index]}", flush=True)
    server.join()
    return 0


def _install(args: argparse.Namespace) -> int:
    from tictac_hooks.enforce.client import install_everywhere

    schedule = Schedule.load(args.order)
    results = install_everywhere(args.ps, schedule, timeout_s=args.timeout,
                                 skip_after_s=args.skip_after,
                                 window_bytes=args.window_bytes)
    for address, r in results.items():
        print(f"{address}: schedule version {r.version} ({schedule.algorithm}), "
              f"{r.expected} of {r.transfers} transfers enforced", file=sys.stderr)
        if r.unmatched:
            print(f"{address}: warning: {len(r.unmatched)} scheduled transfers were never "
                  f"served by this PS, e.g. {r.unmatched[0]!r}", file=sys.stderr)
    print(json.dumps({a: r.to_json() for a, r in results.items()}, indent=1))
    return 0


def _clear(args: argparse.Namespace) -> int:
    from tictac_hooks.enforce.client import clear_everywhere

    clear_everywhere(args.ps, timeout_s=args.timeout)
    return 0


def _stats(args: argparse.Namespace) -> int:
    from tictac_hooks.enforce.client import stats_everywhere

    every = stats_everywhere(args.ps, timeout_s=args.timeout)
    json.dump({"ps": {s.ps: s.to_json(steps=False) for s in every},
               "steps": [step.to_json() for s in every for step in s.steps]},
              sys.stdout, indent=1)
    print()
    return 0


def _trace(args: argparse.Namespace) -> int:
    from tictac_hooks.enforce.client import stats_everywhere
    from tictac_hooks.enforce.trace import write_chrome_trace

    write_chrome_trace([step for s in stats_everywhere(args.ps, timeout_s=args.timeout)
                        for step in s.steps], args.output)
    return 0


def main(argv=None) -> int:
    """`python -m tictac_hooks.enforce.cli ...`: these subcommands without the rest of
    the `tictac` command (used by the local-cluster launcher)."""
    from tictac_hooks.cli import main as tictac_main
    return tictac_main(argv, modules=("tictac_hooks.enforce.cli",))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
