"""`tictac bench` and `tictac bench-report`."""

from __future__ import annotations

import argparse
import json
import os
import sys

QUICK = dict(model="mobilenetv2", mode="inference", workers=2, ps=1, steps=4, block_steps=2,
             warmup=1, profile_steps=2, batch=4, bandwidth=["auto"])
# --emulate-gpu --quick: the given model, workers, PS and links, fewer steps
QUICK_EMULATED = dict(steps=10, block_steps=5, warmup=1, profile_steps=2)


def register(sub: argparse._SubParsersAction) -> None:
    from tictac_hooks.bench.orders import CHECKED, OPTIONAL, SCHEDULES, STOCK
    from tictac_hooks import checks
    from tictac_hooks.enforce.cli import window_bytes_arg
    p = sub.add_parser(
        "bench", help="TensorFlow's default vs TicTac on a shaped network (needs root)",
        description="Runs a PS cluster with every task in its own network namespace behind "
        "a tc-shaped link and compares, interleaved in one run, TensorFlow's default order "
        "(no rendezvous), the rendezvous without a schedule, TensorFlow's own code in the "
        "gated PS (stock), TIC, TAC, a fixed random order, first-use order (each parameter "
        "by its first consumer in the step, as ByteScheduler's TensorFlow plugin; 'layer' "
        "is its old name) and declared order (the model's variable list, as BytePS, "
        "ByteScheduler's PyTorch plugin and P3). Falls back to loopback (and says so) "
        "without root or tc.")
    p.add_argument("--model", default=None,
                   help="resnet50, inceptionv3, vgg16, mobilenetv2, the PS workloads "
                        "dlrm, transformer and cnn, or your own, PATH.py:FUNCTION, "
                        "FUNCTION(batch_size) returning (model, inputs, targets) "
                        "(bench/user_model.py); default resnet50, with --frontend fit "
                        "dlrm")
    p.add_argument("--frontend", choices=("graph", "fit"), default="graph",
                   help="graph: the compat.v1 in-graph replicated bench (default); fit: "
                        "tf_keras fit under ParameterServerStrategy with the TicTac "
                        "callback, comparing TensorFlow's order, declared, first-use, "
                        "paced random, TIC and TAC in the order check's interleaved "
                        "blocks (--check-rounds, --check-block-steps; bench/fit_mode.py)")
    p.add_argument("--verify-rounds", type=int, default=None, metavar="R",
                   help="--frontend fit: after the check's decision, where it kept TIC or "
                        "TAC, R rounds of (kept order, TensorFlow's order) block pairs in "
                        "fresh blocks: what TicTac with its check gives, on steps the "
                        "decision did not see (default 3; 0: off)")
    p.add_argument("--min-shard-bytes", type=int, default=None, metavar="N",
                   help="--frontend fit: shard variables with MinSizePartitioner(N, "
                        "max_shards=#PS) (default 262144, the PS tutorial's; 0: none)")
    p.add_argument("--mode", default="training", choices=("training", "inference"),
                   help="training: forward, backward and the PS's update, gradients "
                        "pushed back; inference: forward only, parameters pulled "
                        "(default training; --frontend fit trains)")
    p.add_argument("--workers", type=int, default=2, help="worker tasks W (default 2)")
    p.add_argument("--ps", type=int, default=1, help="PS tasks (default 1)")
    p.add_argument("--bandwidth", default="auto",
                   help="comma-separated link rates to sweep: '500mbit', or 'auto' (comm = "
                   "comp) / 'auto:R' (comm = R x comp) from the profiled step (default auto)")
    p.add_argument("--steps", type=int, default=20,
                   help="measured steps per schedule and rate (default 20)")
    p.add_argument("--block-steps", type=int, default=5,
                   help="measured steps per block; schedules rotate by block (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per set (default 2)")
    checks.add_renamed_option(
        p, "--batch-size", "--batch", dest="batch", type=int, default=None,
        help="per-worker batch size (default: the model's, see workloads.MODELS)")
    p.add_argument("--schedules", default=None,
                   help=f"comma-separated subset of {','.join(SCHEDULES + (STOCK,))} "
                        "(default: all; stock, the same PS and workers with the native gate "
                        "bypassed, with the native backend only), and of "
                        f"{','.join(o for o in OPTIONAL if o not in (STOCK, CHECKED))} (an "
                        "order whose native-gate pacing aligns the workers of a step, serves "
                        "them one after the other, or is off, or with the gate's work "
                        "conservation on; plain names pace as TicTac does by default), and "
                        f"{CHECKED} (TicTac's default: TIC and TAC "
                        "checked against TensorFlow's order in block pairs, the faster kept "
                        "or the schedule cleared; the blocks measure what was kept)")
    from tictac_hooks.flags import DEFAULTS
    p.add_argument("--check-rounds", type=int, default=None,
                   help="schedule 'checked' (TicTac's order check, then what it kept): "
                        "at most this many rounds of block pairs per candidate (default "
                        f"{DEFAULTS['check_rounds']}, as --tictac_check_rounds)")
    p.add_argument("--check-block-steps", type=int, default=None,
                   help="schedule 'checked': steps per check block (default "
                        f"{DEFAULTS['check_block_steps']}, as --tictac_check_block_steps)")
    p.add_argument("--conserve-after", dest="conserve_after_s", type=float, default=None,
                   metavar="S", help="schedules '<order>-wc': the native gate hands a ready "
                   "transfer out of turn once the link has idled S seconds (default 0.002)")
    p.add_argument("--window-bytes", type=window_bytes_arg, default=None, metavar="BYTES",
                   help="the rendezvous's look-ahead window (default 1048576; 0: scheduled "
                        "transfers strictly one at a time)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT",
                   help="write the result JSON here")
    p.add_argument("--quick", action="store_true",
                   help="a CI-sized smoke run (MobileNet-v2 inference, 2 workers, 4 steps)")
    p.add_argument("--loopback", action="store_true", help="do not shape: loopback only")
    p.add_argument("--backend", choices=("native", "proxy"), default="native",
                   help="where the gate runs at each PS (default native)")
    p.add_argument("--pin-workers", action="store_true",
                   help="run worker k on CPU k (mod the CPUs): the workers of a step do "
                        "not share a core, as on a cluster of one machine per worker")
    p.add_argument("--no-calibration", dest="calibrate", action="store_false",
                   help="leave out the calibration blocks (the gate with no order over the "
                        "fast profiling link, and the compute reference) from each round; "
                        "the simulator then takes its compute from the profiling phase")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="bound on the run, seconds (default 1800)")
    g = p.add_argument_group(
        "GPU-speed workers (docs/EMULATION.md)",
        "Replay a model's profile with its compute emulated: delay ops on the profile's "
        "dependency structure, summing to --compute-ms per step, that cost wall time and "
        "no core, so 16-32 workers fit on a small machine while every PS link is shared "
        "as on a cluster. --model is a built-in profile (resnet50, vgg16, transformer, dlrm, "
        "cnn) or a profile's path; default schedules stock,tic,tac (TensorFlow's order "
        "on the same workers, the gate bypassed). With --frontend fit the replay is "
        "trained by model.fit under ParameterServerStrategy with the TicTac callback, "
        "TensorFlow's order being its check's own blocks")
    g.add_argument("--emulate-gpu", action="store_true",
                   help="emulate the workers' compute (needs --compute-ms)")
    g.add_argument("--compute-ms", type=float, default=None, metavar="MS",
                   help="the step's compute on one worker's GPU, ms")
    g.add_argument("--byte-scale", type=float, default=None, metavar="S",
                   help="every variable's bytes and every link's rate x S, so comm time "
                        "stays and the PS's CPU per byte falls (default: picked from the "
                        "workers and the model's bytes, and printed)")
    g.add_argument("--max-ops", type=int, default=16,
                   help="delay ops per worker step, each after the parameters it first "
                        "needs, read from each PS as one variable (default 16)")
    p.set_defaults(func=_bench)
    r = sub.add_parser("bench-report", help="Markdown + PNG plots from `tictac bench` JSON files")
    r.add_argument("inputs", nargs="+", metavar="RESULT.json")
    checks.add_renamed_option(r, "--output-dir", "--out", dest="out", default=None,
                              metavar="DIR", help="directory for report.md + PNGs (required)")
    r.add_argument("--repredict", action="store_true",
                   help="recompute the simulator's predictions with this code from the "
                        "inputs saved beside each result (RESULT.sim.json.gz)")
    r.set_defaults(func=_report)
    analyze = sub.choices.get("analyze")
    if analyze is not None:  # `tictac analyze --model dlrm|PATH.py:FUNCTION --profile DIR`
        analyze.set_defaults(func=_analyze_ps_workload(analyze.get_default("func")))


def _analyze_ps_workload(applications):  # type: ignore[no-untyped-def]
    """`tictac analyze` for the PS workloads too (the built-in dlrm, transformer and cnn,
    or PATH.py:FUNCTION; bench/user_model.py): with --profile it writes their profile;
    keras.applications names go on to ``applications``."""
    def run(args: argparse.Namespace) -> int:
        from tictac_hooks.bench import user_model
        if not user_model.is_model_spec(args.model):
            return applications(args)
        if not args.profile:
            raise user_model.UserModelError(
                f"--model {args.model}: a PS workload is analyzed with --profile DIR "
                "(then `tictac whatif --profile DIR`); the analysis table is for "
                "keras.applications models")
        import os
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
        from tictac_hooks.graph.tf.cli import write_profile
        from tictac_hooks.graph.tf.model_profile import keras_profile
        source = user_model.resolve(args.model)
        from tictac_hooks.bench.models import DEFAULT_BATCH
        batch = args.batch_size or DEFAULT_BATCH.get(args.model, user_model.DEFAULT_BATCH)
        loaded = user_model.load(source, batch)
        return write_profile(keras_profile(loaded.model, (loaded.inputs, loaded.targets),
                                           source.label.replace(".py:", "-")), args.profile)
    return run


def _bench(args: argparse.Namespace) -> int:
    if args.frontend == "fit":
        from tictac_hooks.bench.fit_mode import main_from_args
        args.model = args.model or ("resnet50" if args.emulate_gpu else "dlrm")
        return main_from_args(args)
    from tictac_hooks.bench.user_model import refuse_in_graph_mode
    args.model = args.model or "resnet50"
    refuse_in_graph_mode(args.min_shard_bytes)
    if args.verify_rounds is not None:
        raise ValueError("--verify-rounds applies to --frontend fit; the compat.v1 bench "
                         "measures what TicTac's check kept with schedule 'checked'")
    from tictac_hooks.bench.runner import BenchConfig, run
    settings = dict(model=args.model, mode=args.mode, workers=args.workers, ps=args.ps,
                    bandwidth=[b for b in args.bandwidth.split(",") if b.strip()],
                    steps=args.steps, block_steps=args.block_steps, warmup=args.warmup,
                    batch=args.batch,
                    schedules=None if args.schedules is None else
                    [s.strip() for s in args.schedules.split(",") if s.strip()],
                    loopback=args.loopback, timeout_s=args.timeout, backend=args.backend,
                    pin_workers=args.pin_workers, calibrate=args.calibrate)
    for name in ("window_bytes", "check_rounds", "check_block_steps", "conserve_after_s"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    if args.emulate_gpu != (args.compute_ms is not None):
        raise ValueError("--emulate-gpu and --compute-ms go together: the emulated step's "
                         "compute is --compute-ms")
    if args.emulate_gpu:
        settings.update(compute_ms=args.compute_ms, byte_scale=args.byte_scale,
                        max_ops=args.max_ops)
    if args.quick:
        settings.update(QUICK_EMULATED if args.emulate_gpu else QUICK)
    result = run(BenchConfig(**settings))
    sim_inputs = [run_.sim_inputs for run_ in result.runs]
    from tictac_hooks.bench.report import text_table
    print(text_table([result]))
    if args.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        if any(sim_inputs):
            from tictac_hooks.bench.predict import save_inputs
            print(f"wrote {save_inputs(args.json_out, sim_inputs)}", file=sys.stderr)
        with open(args.json_out, "w") as f:
            json.dump(result.to_json(), f, indent=1)
        print(f"wrote {args.json_out}", file=sys.stderr)
    if result.incomplete:
        print(f"tictac bench: error: {result.incomplete}; the result holds the "
              f"{len(result.runs)} of {len(settings['bandwidth'])} bandwidth(s) it "
              f"finished (raise --timeout to measure them all)", file=sys.stderr)
        return 1
    return 0


def _report(args: argparse.Namespace) -> int:
    from tictac_hooks.bench.report import write_report
    if args.out is None:
        raise ValueError("--output-dir DIR is required: the directory report.md and "
                         "the plots go to")
    path = write_report(args.inputs, args.out, repredict=args.repredict)
    print(f"wrote {path}")
    return 0
