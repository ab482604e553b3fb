"""Numbered schema migrations, each applied once, in one transaction with its record.

Applied migrations are never edited: a schema change is a new function appended to
`MIGRATIONS`. Numbers are owned by the part that needs the tables:
1 scan (registry), 2 runs (runner), 3 audit (auditor), 4 scan: exact bytes of odd file
names and the vocabulary codec (registry), 5 runs: measurement protocol and trust (runner),
6 stacks and lookup caches (runner),
7 quality (runner), 9 calibration (runner), 10 run ids across registries (runner, Ray/exchange),
11 the quiet noise floor per host (runner: the load guard), 12 capacity curves (runner),
13 llama-server's pass factor per host and model (runner: calibrate).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import duckdb

from specreg.errors import RegistryError

Migration = Callable[[duckdb.DuckDBPyConnection], None]


def m001_scan(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        """
        CREATE TABLE scans (
            scan_id      BIGINT PRIMARY KEY,
            started_at   TIMESTAMPTZ NOT NULL,
            finished_at  TIMESTAMPTZ,
            roots        VARCHAR[] NOT NULL,
            host         VARCHAR,
            n_files      BIGINT,
            n_new        BIGINT,
            n_changed    BIGINT,
            n_unchanged  BIGINT,
            n_removed    BIGINT,
            n_errors     BIGINT,
            seconds      DOUBLE
        )
        """
    )
    # One row per real file. Symlinks pointing at it are listed in `links`.
    con.execute(
        """
        CREATE TABLE files (
            path           VARCHAR PRIMARY KEY,
            links          VARCHAR[],
            size           BIGINT,
            mtime_ns       BIGINT,
            inode          BIGINT,
            status         VARCHAR NOT NULL,   -- ok | error | gone
            error          VARCHAR,
            model_id       VARCHAR,
            split_no       INTEGER,
            split_count    INTEGER,
            header_sha256  VARCHAR,
            n_params       BIGINT,
            n_tensors      BIGINT,
            first_scan     BIGINT,
            last_scan      BIGINT,
            gone_scan      BIGINT
        )
        """
    )
    # Errors that are not about one file: broken links, missing split parts, bad roots.
    con.execute(
        """
        CREATE TABLE scan_errors (
            scan_id  BIGINT NOT NULL,
            path     VARCHAR NOT NULL,
            kind     VARCHAR NOT NULL,
            reason   VARCHAR NOT NULL
        )
        """
    )
    con.execute(
        """
        CREATE TABLE models (
            model_id              VARCHAR PRIMARY KEY,
            status                VARCHAR NOT NULL,  -- present | incomplete | gone
            path                  VARCHAR NOT NULL,  -- first part
            paths                 VARCHAR[] NOT NULL,
            parts_missing         VARCHAR[],
            n_bytes               BIGINT,
            mtime_ns              BIGINT,
            gguf_version          INTEGER,
            architecture          VARCHAR,
            name                  VARCHAR,
            basename              VARCHAR,
            size_label            VARCHAR,
            finetune              VARCHAR,
            organization          VARCHAR,
            file_type             INTEGER,
            quant                 VARCHAR,
            n_params              BIGINT,
            n_params_active       BIGINT,
            bits_per_weight       DOUBLE,
            n_tensors             BIGINT,
            tensor_types          JSON,
            block_count           BIGINT,
            context_length        BIGINT,
            embedding_length      BIGINT,
            expert_count          BIGINT,
            expert_used_count     BIGINT,
            expert_used_key       VARCHAR,
            is_moe                BOOLEAN,
            is_recurrent          BOOLEAN,
            is_hybrid             BOOLEAN,
            ssm_keys              VARCHAR[],
            sliding_window        BIGINT,
            uses_mla              BOOLEAN,
            nextn_predict_layers  BIGINT,
            has_mtp_tensors       BOOLEAN,
            draft_kind            VARCHAR,   -- eagle3 | dflash | dspark | NULL
            draft_binding         JSON,
            is_mmproj             BOOLEAN,
            tok_model             VARCHAR,
            tok_pre               VARCHAR,
            vocab_type            VARCHAR,
            n_tokens              BIGINT,
            tok_fingerprint       VARCHAR,
            vocab_sha             VARCHAR,
            bos_id                BIGINT,
            eos_id                BIGINT,
            eot_id                BIGINT,
            pad_id                BIGINT,
            bos_text              VARCHAR,
            eos_text              VARCHAR,
            eot_text              VARCHAR,
            pad_text              VARCHAR,
            add_bos_stored        BOOLEAN,
            add_eos_stored        BOOLEAN,
            add_bos               BOOLEAN,
            add_eos               BOOLEAN,
            vocab_error           VARCHAR,
            chat_template_sha256  VARCHAR,
            first_scan            BIGINT,
            last_scan             BIGINT
        )
        """
    )
    # Every scalar key/value of the model's first part; arrays as type and length only.
    con.execute(
        """
        CREATE TABLE model_kv (
            model_id  VARCHAR NOT NULL,
            key       VARCHAR NOT NULL,
            type      VARCHAR NOT NULL,
            value     JSON,
            PRIMARY KEY (model_id, key)
        )
        """
    )
    # Vocabularies stored once per distinct token list, for exact diffs without re-reading.
    con.execute(
        """
        CREATE TABLE vocabs (
            vocab_sha     VARCHAR PRIMARY KEY,
            n_tokens      BIGINT NOT NULL,
            tokens_z      BLOB NOT NULL,   -- zlib of the serialized GGUF string array
            token_types   BLOB             -- int32 little-endian, or NULL
        )
        """
    )


def m002_runs(con: duckdb.DuckDBPyConnection) -> None:
    # One row per measured configuration, failed runs included. Models are referenced by
    # registry model_id; the paths are kept too because files move.
    con.execute("CREATE SEQUENCE runs_seq START 1")
    con.execute(
        """
        CREATE TABLE runs (
            run_id            BIGINT PRIMARY KEY DEFAULT nextval('runs_seq'),
            kind              VARCHAR NOT NULL,   -- run | baseline | verify
            status            VARCHAR NOT NULL,   -- ok | failed
            started_at        TIMESTAMPTZ NOT NULL,
            seconds           DOUBLE,
            error_kind        VARCHAR,            -- load | oom | crash | timeout | port | args | spec-init | ...
            error             VARCHAR,            -- specreg's one-line message
            llama_message     VARCHAR,            -- llama.cpp's own line
            target_model_id   VARCHAR,
            draft_model_id    VARCHAR,
            target_path       VARCHAR,
            draft_path        VARCHAR,
            config            JSON NOT NULL,
            config_label      VARCHAR NOT NULL,
            spec_type         VARCHAR NOT NULL,
            k                 INTEGER,
            p_min             DOUBLE,
            draft_threads     INTEGER,
            experts           INTEGER,
            temperature       DOUBLE,
            seed              BIGINT,
            behaviour_changing BOOLEAN,
            llama_version     VARCHAR,
            llama_dialect     VARCHAR,
            llama_bin_dir     VARCHAR,
            argv              VARCHAR[],
            host_fingerprint  VARCHAR,
            host              JSON,
            threads           INTEGER,
            task              VARCHAR,
            prompt_set        VARCHAR,
            n_predict         INTEGER,
            repeats           INTEGER,
            speculative_active BOOLEAN,          -- /slots[].speculative
            tokens_per_s      DOUBLE,            -- median over repeats
            tokens_per_s_lo   DOUBLE,
            tokens_per_s_hi   DOUBLE,
            draft_n           BIGINT,
            draft_n_accepted  BIGINT,
            acceptance        DOUBLE,            -- 0..1, NULL when nothing was drafted
            baseline_run_id   BIGINT,
            speedup           DOUBLE,
            speedup_lo        DOUBLE,
            speedup_hi        DOUBLE,
            verdict           VARCHAR,           -- pass | fail (verify runs)
            verdict_reason    VARCHAR,
            log_path          VARCHAR
        )
        """
    )
    con.execute(
        """
        CREATE TABLE run_prompts (
            run_id            BIGINT NOT NULL,
            prompt_id         VARCHAR NOT NULL,
            prompt_sha256     VARCHAR NOT NULL,
            n_samples         INTEGER NOT NULL,
            prompt_n          INTEGER,
            predicted_n       INTEGER,
            tokens_per_s      DOUBLE,            -- median over repeats
            tokens_per_s_lo   DOUBLE,
            tokens_per_s_hi   DOUBLE,
            samples_tps       DOUBLE[],
            foreign_cpu_s     DOUBLE[],
            draft_n           BIGINT,
            draft_n_accepted  BIGINT,
            output_sha256     VARCHAR,
            stop_type         VARCHAR,
            verdict           VARCHAR,           -- identical | near-tie | diverged | changed
            divergence        JSON,              -- position, both continuations, margins
            PRIMARY KEY (run_id, prompt_id)
        )
        """
    )


def m003_audit(con: duckdb.DuckDBPyConnection) -> None:
    """The auditor's verdicts: one row per audit, its vocabulary classes and verdicts between
    them, and the ordered pairs those verdicts do not settle (the compatibility graph's edges)."""
    con.execute(
        """
        CREATE TABLE audit_runs (
            audit_id           BIGINT PRIMARY KEY,
            created_at         TIMESTAMPTZ NOT NULL,
            rules_label        VARCHAR NOT NULL,
            llama_build        INTEGER NOT NULL,
            n_models           BIGINT NOT NULL,
            n_pairs            BIGINT NOT NULL,
            counts             JSON,
            refusals           JSON,
            vocab_comparisons  BIGINT,
            seconds            DOUBLE
        )
        """
    )
    con.execute(
        """
        CREATE TABLE audit_classes (
            audit_id  BIGINT NOT NULL,
            class_id  INTEGER NOT NULL,
            model_id  VARCHAR NOT NULL,
            family    VARCHAR,   -- tokenizer family: models sharing a token-text fingerprint
            PRIMARY KEY (audit_id, model_id)
        )
        """
    )
    con.execute(
        """
        CREATE TABLE audit_class_verdicts (
            audit_id      BIGINT NOT NULL,
            target_class  INTEGER NOT NULL,
            draft_class   INTEGER NOT NULL,
            accepts       BOOLEAN NOT NULL,
            failed        VARCHAR[],
            n_pairs       BIGINT NOT NULL,
            PRIMARY KEY (audit_id, target_class, draft_class)
        )
        """
    )
    con.execute(
        """
        CREATE TABLE audit_pairs (
            audit_id       BIGINT NOT NULL,
            target_id      VARCHAR NOT NULL,
            draft_id       VARCHAR NOT NULL,
            verdict        VARCHAR NOT NULL,
            llama_accepts  BOOLEAN,
            findings       VARCHAR[],
            PRIMARY KEY (audit_id, target_id, draft_id)
        )
        """
    )


def m004_scan_bytes_and_codec(con: duckdb.DuckDBPyConnection) -> None:
    """File names that are not valid UTF-8 keep their exact bytes (`files.path` holds them
    with `\\xNN` escapes, which VARCHAR can store); vocabularies name their codec."""
    con.execute("ALTER TABLE files ADD COLUMN path_raw BLOB")  # NULL: `path` is exact
    # Rows written before this migration are zlib; new ones name what they use.
    con.execute("ALTER TABLE vocabs ADD COLUMN codec VARCHAR DEFAULT 'zlib'")


def m007_quality(con: duckdb.DuckDBPyConnection) -> None:
    # One row per logit comparison with llama-perplexity: a lossy configuration against its
    # lossless reference (purpose 'quality'), or a draft against its target on the target's
    # own text (purpose 'agreement'). `base_*` is the reference/target, `model_*` the other.
    con.execute("CREATE SEQUENCE quality_seq START 1")
    con.execute(
        """
        CREATE TABLE quality_measurements (
            measurement_id    BIGINT PRIMARY KEY DEFAULT nextval('quality_seq'),
            purpose           VARCHAR NOT NULL,   -- quality | agreement
            status            VARCHAR NOT NULL,   -- ok | failed
            started_at        TIMESTAMPTZ NOT NULL,
            seconds           DOUBLE,
            error_kind        VARCHAR,
            error             VARCHAR,
            llama_message     VARCHAR,
            base_model_id     VARCHAR,
            base_path         VARCHAR,
            model_id          VARCHAR,
            model_path        VARCHAR,
            experts           INTEGER,            -- override of the compared model; NULL: default
            expert_key        VARCHAR,
            config            JSON NOT NULL,
            task              VARCHAR,
            text_name         VARCHAR,
            text_sha256       VARCHAR,
            text_source       VARCHAR,            -- shipped | user | generated
            ctx               INTEGER,
            n_chunks          INTEGER,
            n_tokens          BIGINT,             -- scored positions
            method            VARCHAR,            -- kl-divergence | saved-logits
            n_vocab_base      INTEGER,
            n_vocab_model     INTEGER,
            llama_version     VARCHAR,
            llama_build_id    VARCHAR,
            llama_bin_dir     VARCHAR,
            argv              VARCHAR[],
            host_fingerprint  VARCHAR,
            host              JSON,
            threads           INTEGER,
            mean_kld          DOUBLE,
            mean_kld_unc      DOUBLE,
            kld_median        DOUBLE,
            kld_p90           DOUBLE,
            kld_p95           DOUBLE,
            kld_p99           DOUBLE,
            kld_p999          DOUBLE,
            kld_max           DOUBLE,
            same_top          DOUBLE,             -- 0..1
            same_top_unc      DOUBLE,
            ppl               DOUBLE,             -- of the compared model
            ppl_unc           DOUBLE,
            ppl_base          DOUBLE,
            ppl_base_unc      DOUBLE,
            ln_ppl_ratio      DOUBLE,
            ln_ppl_ratio_unc  DOUBLE,
            rms_dp            DOUBLE,             -- 0..1
            temperature       DOUBLE,
            accept            DOUBLE,             -- target's probability of the draft's top token
            confidence        JSON,               -- p_min -> [share drafted, same-top among them]
            log_path          VARCHAR
        )
        """
    )


def m005_measurement_protocol(con: duckdb.DuckDBPyConnection) -> None:
    """Runs say how their samples were taken and whether they can be trusted; runs recorded
    before (protocol v1) that replayed prompts to a method that keeps state are marked."""
    from specreg.llamacpp import keeps_state

    for column, kind in (
        ("regime", "VARCHAR"),  # first-encounter | warm | replay
        ("protocol", "JSON"),  # runner/protocol.py's Protocol
        ("repeat_figures", "JSON"),  # per repeat: drafted, accepted, tokens/s
        ("phase_figures", "JSON"),  # warm runs: first and later prompts
        ("trusted", "BOOLEAN DEFAULT TRUE"),
        ("trust_reason", "VARCHAR"),
        ("owner", "VARCHAR"),  # host:pid while status = 'running'
    ):
        con.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
    for column in ("samples_draft_n", "samples_draft_n_accepted"):
        con.execute(f"ALTER TABLE run_prompts ADD COLUMN {column} BIGINT[]")
    for column in ("samples_session", "samples_position"):
        con.execute(f"ALTER TABLE run_prompts ADD COLUMN {column} INTEGER[]")
    # Served requests: a long-lived server, the warm regime (serve wrote it into config).
    con.execute(
        "UPDATE runs SET regime = config->>'regime' WHERE kind = 'serve' AND config->>'regime' IS NOT NULL"
    )
    # The runner's protocol v1: one llama-server per run answered a warm-up request of the
    # workload's first prompt, then every prompt `repeats` times in turn, a contended sample
    # again on the same server. For a method that keeps state that is a replay.
    v1 = json.dumps({
        "version": 1,
        "name": "one-server/v1",
        "isolation": "one-server",
        "warmup": "the workload's first prompt, 8 tokens",
        "note": "recorded before the measurement protocol v2 (issue 18)",
    })  # fmt: skip
    runner = "kind <> 'serve' AND protocol IS NULL"
    stateful = sorted(
        t
        for (t,) in con.execute("SELECT DISTINCT spec_type FROM runs").fetchall()
        if t and keeps_state(t)
    )
    on_server = "coalesce(config->>'engine', 'server') = 'server'"
    if stateful:
        marks = ", ".join("?" for _ in stateful)
        for repeated, why in (
            (
                "coalesce(repeats, 1) > 1",
                "its repeats were measured on one llama-server, so from the second repeat on the "
                "server had seen the prompt and its answer",
            ),
            (
                "coalesce(repeats, 1) <= 1",
                "it was measured on a llama-server that had answered a warm-up request of the "
                "workload's first prompt (and a contention retry would replay its prompt)",
            ),
        ):
            con.execute(
                f"UPDATE runs SET trusted = false, regime = 'replay', protocol = ?, "
                f"trust_reason = ? || spec_type || ' keeps state across requests and ' || ? "
                f"WHERE {runner} AND {on_server} AND {repeated} AND spec_type IN ({marks})",
                [v1, "replay-affected: ", why, *stateful],
            )
    con.execute(f"UPDATE runs SET regime = 'first-encounter', protocol = ? WHERE {runner}", [v1])


def m006_stacks_and_lookup_caches(con: duckdb.DuckDBPyConnection) -> None:
    # Kept beside the store that owns the tables; imported only when a registry needs it, so
    # read commands do not load those modules at start-up.
    from specreg.registry.lookup_caches import m006_stacks_and_lookup_caches as migration

    migration(con)


def m009_calibration(con: duckdb.DuckDBPyConnection) -> None:
    from specreg.registry.calibration import m009_calibration as migration

    migration(con)


def m010_run_uuid(con: duckdb.DuckDBPyConnection) -> None:
    # run_id is a local sequence: two hosts' registries both have a run 7. A run's identity
    # across registries (Ray workers' results, `runs export|import`) is a UUID minted by the
    # registry that records it first and carried unchanged wherever the run is copied.
    con.execute("ALTER TABLE runs ADD COLUMN run_uuid VARCHAR")
    # No unique index: DuckDB refuses ALTER TABLE on an indexed table, which later migrations
    # (and tests rebuilding an old schema) need; the writers check the id (registry/exchange).
    con.execute("UPDATE runs SET run_uuid = CAST(uuid() AS VARCHAR)")


def m011_noise_floors(con: duckdb.DuckDBPyConnection) -> None:
    from specreg.registry.noise import m011_noise_floors as migration

    migration(con)


def m012_capacity(con: duckdb.DuckDBPyConnection) -> None:
    from specreg.registry.capacity import m012_capacity as migration

    migration(con)


def m013_pass_factors(con: duckdb.DuckDBPyConnection) -> None:
    from specreg.registry.calibration import m013_pass_factors as migration

    migration(con)


MIGRATIONS: list[tuple[int, str, Migration]] = [
    (1, "scan tables", m001_scan),
    (2, "runs tables", m002_runs),
    (3, "audit tables", m003_audit),
    (4, "odd file names and vocabulary codec", m004_scan_bytes_and_codec),
    (5, "measurement protocol and trust of runs", m005_measurement_protocol),
    (6, "speculative stacks and lookup caches", m006_stacks_and_lookup_caches),
    (7, "quality and agreement measurements", m007_quality),
    (9, "calibration curves and host bandwidth", m009_calibration),
    (10, "run ids unique across registries", m010_run_uuid),
    (11, "quiet noise floor of measurements per host", m011_noise_floors),
    (12, "capacity curves: throughput under load per layout and concurrency", m012_capacity),
    (13, "llama-server's pass factor per host and model", m013_pass_factors),
]


def applied(con: duckdb.DuckDBPyConnection, *, create: bool = True) -> set[int]:
    """Numbers of the migrations this registry has; `create=False` never writes (read-only)."""
    if create:
        con.execute(
            "CREATE TABLE IF NOT EXISTS migrations "
            "(number INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMPTZ NOT NULL)"
        )
    else:
        # Asking for the table and catching its absence: listing duckdb_tables() costs ~10 ms
        # on every read-only open, which is most of what `specreg models` waits for.
        import duckdb

        try:
            rows = con.execute("SELECT number FROM migrations").fetchall()
        except duckdb.CatalogException:
            return set()
        return {row[0] for row in rows}
    return {row[0] for row in con.execute("SELECT number FROM migrations").fetchall()}


def _check_not_newer(done: set[int]) -> None:
    known = {number for number, _, _ in MIGRATIONS}
    unknown = sorted(done - known)
    if unknown:
        raise RegistryError(
            f"the registry has schema migration {unknown[-1]} but this specreg knows only "
            f"{', '.join(map(str, sorted(known)))}: upgrade specreg"
        )


def pending(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Migrations this specreg has and the registry lacks (reads only)."""
    done = applied(con, create=False)
    return sorted(number for number, _, _ in MIGRATIONS if number not in done)


def check_current(con: duckdb.DuckDBPyConnection, db_path: object) -> None:
    """For a read-only open: the registry must have exactly the schema this specreg reads."""
    done = applied(con, create=False)
    if not done:
        raise RegistryError(f"{db_path} is not a specreg registry: run `specreg scan DIR` first")
    _check_not_newer(done)
    missing = sorted(number for number, _, _ in MIGRATIONS if number not in done)
    if missing:
        raise RegistryError(
            f"the registry {db_path} was written by an older specreg (it lacks schema "
            f"migration {', '.join(map(str, missing))}), and a read-only open cannot upgrade "
            "it: run `specreg scan` once where the registry is writable"
        )


def migrate(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Apply pending migrations in order; return the numbers applied."""
    done = applied(con)
    _check_not_newer(done)
    ran = []
    for number, name, fn in sorted(MIGRATIONS, key=lambda m: m[0]):
        if number in done:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            fn(con)
            con.execute("INSERT INTO migrations VALUES (?, ?, current_timestamp)", [number, name])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        ran.append(number)
    return ran
