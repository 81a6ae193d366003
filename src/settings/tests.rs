//! Unit tests for `model-settings.json` parsing and validation.

use super::*;

fn parse(json: &str) -> Result<ModelSettings, SettingsError> {
    ModelSettings::parse(json, "digits", &ModelDefaults::default())
}

fn problems(json: &str) -> Vec<String> {
    parse(json).expect_err("should fail").problems
}

fn ok(json: &str) -> ModelSettings {
    parse(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

#[test]
fn empty_object_gives_defaults_and_folder_name() {
    let s = ok("{}");
    assert_eq!(s.name, "digits");
    assert_eq!(s.uri, PathBuf::from("model.onnx"));
    assert_eq!(s.version, None);
    let b = s.batching;
    assert_eq!(
        (b.max_batch_size, b.max_batch_time),
        (32, Duration::from_millis(10))
    );
    assert_eq!(
        (b.policy, b.max_queue_size, b.timeout),
        (BatchPolicyKind::Adaptive, 1024, Duration::from_secs(60))
    );
    assert!(b.batching_enabled());
    assert_eq!((s.instances, s.execution_provider), (1, ExecutionProvider::Auto));
    assert_eq!(
        (s.device_ids, s.intra_op_threads, s.warmup),
        (vec![0], None, true)
    );
    assert!(s.cuda.is_empty());
}

#[test]
fn full_file_with_every_field() {
    let s = ok(r#"{
        "name": "mnist-v2", "parameters": {"uri": "./onnx/model.onnx", "version": "v0.1.0"},
        "max_batch_size": 64, "max_batch_time": 0.005, "batch_policy": "fixed", "max_queue_size": 10,
        "timeout": 2.5, "instances": 2, "execution_provider": "cuda", "device_ids": [1, 0],
        "intra_op_threads": 4, "warmup": false,
        "cuda": {"gpu_mem_limit": 1073741824, "arena_extend_strategy": "kSameAsRequested",
                 "cudnn_conv_algo_search": "HEURISTIC", "do_copy_in_default_stream": true}
    }"#);
    let batching = BatchSettings {
        max_batch_size: 64,
        max_batch_time: Duration::from_micros(5000),
        policy: BatchPolicyKind::Fixed,
        max_queue_size: 10,
        timeout: Duration::from_millis(2500),
        max_batch_tokens: None,
        max_padding_ratio: None,
        priority_levels: 0,
        default_priority: 0,
        refuse_predicted_late: true,
    };
    let cuda = CudaOptions {
        gpu_mem_limit: Some(1 << 30),
        arena_extend_strategy: Some(ArenaExtendStrategy::SameAsRequested),
        cudnn_conv_algo_search: Some(CudnnConvAlgoSearch::Heuristic),
        do_copy_in_default_stream: Some(true),
    };
    let expected = ModelSettings {
        name: "mnist-v2".into(),
        uri: PathBuf::from("onnx/model.onnx"),
        version: Some("v0.1.0".into()),
        batching,
        instances: 2,
        execution_provider: ExecutionProvider::Cuda,
        device_ids: vec![1, 0],
        intra_op_threads: Some(4),
        warmup: false,
        pinned: false,
        cuda,
        padding: Default::default(),
        batch_axes: Default::default(),
        declared: Declared::default(),
        unused: Vec::new(),
        ignored: Vec::new(),
        triton_config: None,
        labels: Default::default(),
        reshape: Default::default(),
        sequence: None,
        pipeline: None,
        op_libraries: Vec::new(),
    };
    assert_eq!(s, expected);
}

#[test]
fn server_defaults_fill_missing_fields_and_file_wins() {
    let defaults = ModelDefaults {
        max_batch_size: 8,
        max_batch_time: Duration::from_millis(3),
        batch_policy: BatchPolicyKind::Fixed,
        max_queue_size: 5,
        timeout: Duration::from_secs(7),
        instances: 3,
        execution_provider: ExecutionProvider::Cpu,
        intra_op_threads: Some(2),
        warmup: false,
    };
    let s = ModelSettings::parse("{}", "m", &defaults).unwrap();
    let b = s.batching;
    assert_eq!(
        (b.max_batch_size, b.max_batch_time, b.policy),
        (8, Duration::from_millis(3), BatchPolicyKind::Fixed)
    );
    assert_eq!(
        (b.max_queue_size, b.timeout, s.instances),
        (5, Duration::from_secs(7), 3)
    );
    assert_eq!(
        (s.execution_provider, s.intra_op_threads, s.warmup),
        (ExecutionProvider::Cpu, Some(2), false)
    );
    let s = ModelSettings::parse(
        r#"{"max_batch_size": 1, "intra_op_threads": null}"#,
        "m",
        &defaults,
    )
    .unwrap();
    assert_eq!((s.batching.max_batch_size, s.intra_op_threads), (1, None));
    assert!(!s.batching.batching_enabled());
    // A CPU-only server default does not make a model's cuda options a contradiction.
    assert!(ModelSettings::parse(r#"{"cuda": {"gpu_mem_limit": 1}}"#, "m", &defaults).is_ok());
}

#[test]
fn defaults_validate_uses_the_same_ranges() {
    assert_eq!(ModelDefaults::default().validate(), Ok(()));
    let bad = ModelDefaults {
        max_batch_size: 70_000,
        max_batch_time: Duration::from_secs(61),
        ..Default::default()
    };
    let e = bad.validate().unwrap_err();
    assert_eq!(e.problems.len(), 2, "{e}");
    assert!(
        e.problems[0].starts_with("`max_batch_size` must be an integer between 0 and 65536"),
        "{e}"
    );
}

#[test]
fn null_counts_as_not_given() {
    let s = ok(
        r#"{"name": null, "parameters": {"uri": null, "version": null}, "max_batch_size": null, "cuda": null}"#,
    );
    assert_eq!((s.name.as_str(), s.batching.max_batch_size), ("digits", 32));
    assert_eq!(s.uri, PathBuf::from("model.onnx"));
}

#[test]
fn kserve_batcher_names_convert_milliseconds() {
    let s = ok(r#"{"batcher": {"maxBatchSize": 16, "maxLatency": 500, "timeout": 30}}"#);
    assert_eq!(s.batching.max_batch_size, 16);
    assert_eq!(s.batching.max_batch_time, Duration::from_millis(500));
    assert_eq!(s.batching.timeout, Duration::from_secs(30));
    // Equal values under both names are fine (10 ms == 0.01 s).
    let s = ok(
        r#"{"max_batch_time": 0.01, "max_batch_size": 8, "batcher": {"maxBatchSize": 8, "maxLatency": 10}}"#,
    );
    assert_eq!(
        (s.batching.max_batch_size, s.batching.max_batch_time),
        (8, Duration::from_millis(10))
    );
}

#[test]
fn kserve_conflicts_name_both_fields() {
    let p = problems(
        r#"{"max_batch_size": 32, "max_batch_time": 0.01, "timeout": 5,
            "batcher": {"maxBatchSize": 16, "maxLatency": 500, "timeout": 6}}"#,
    );
    assert_eq!(
        p,
        [
            "`batcher.maxBatchSize` and `max_batch_size` disagree (16 vs 32); set only one of them",
            "`batcher.maxLatency` and `max_batch_time` disagree (0.5 s vs 0.01 s); set only one of them",
            "`batcher.timeout` and `timeout` disagree (6 s vs 5 s); set only one of them",
        ]
    );
    assert_eq!(
        problems(r#"{"batcher": {"maxLatency": 60001}}"#),
        ["`batcher.maxLatency` must be a number of milliseconds between 0 and 60000, got 60001"]
    );
}

#[test]
fn unknown_fields_are_named_with_path_and_suggestion() {
    assert_eq!(
        problems(r#"{"max_batch_sise": 32}"#),
        ["`max_batch_sise` is an unknown field (did you mean `max_batch_size`?)"]
    );
    let p = problems(
        r#"{"parameters": {"url": "m.onnx"}, "cuda": {"gpu_mem_limt": 1}, "batcher": {"maxBatchsize": 2}}"#,
    );
    assert_eq!(
        p,
        [
            "`parameters.url` is an unknown field (did you mean `parameters.uri`?)",
            "`batcher.maxBatchsize` is an unknown field (did you mean `batcher.maxBatchSize`?)",
            "`cuda.gpu_mem_limt` is an unknown field (did you mean `cuda.gpu_mem_limit`?)",
        ]
    );
}

#[test]
fn unknown_fields_without_suggestion_list_the_known_ones() {
    assert_eq!(
        problems(r#"{"parameters": {"environment_tarball": "env.tar.gz"}}"#),
        ["`parameters.environment_tarball` is an unknown field (known fields: `uri`, `version`, `content_type`, `format`, `extra`)"]
    );
    let p = problems(r#"{"inputs": [{"name": "x", "dims": [1]}]}"#);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("`inputs[0].dims` is an unknown field"), "{p:?}");
}

#[test]
fn mlserver_fields_are_accepted_type_checked_and_named_as_unused() {
    let s = ok(
        r#"{"implementation": "mlserver_sklearn.SKLearnModel", "parallel_workers": 2,
        "warm_workers": false, "platform": "onnx", "versions": ["1"], "cache_enabled": false,
        "parameters": {"uri": "model.onnx", "content_type": "np", "format": "onnx", "extra": {"k": 1}}}"#,
    );
    assert_eq!(
        s.unused,
        [
            "implementation",
            "parallel_workers",
            "warm_workers",
            "platform",
            "versions",
            "cache_enabled",
            "parameters.content_type",
            "parameters.format",
            "parameters.extra"
        ]
    );
    assert_eq!(
        problems(
            r#"{"implementation": 3, "parallel_workers": -1, "versions": [1], "parameters": {"extra": []}}"#
        ),
        [
            "`implementation` must be a string, got 3",
            "`parallel_workers` must be a non-negative integer, got -1",
            "`versions` must be an array of strings, got [1]",
            "`parameters.extra` must be an object, got []",
        ]
    );
    // Accepted-but-unused fields never need new sessions.
    let plain = ok("{}");
    assert!(!plain.requires_new_sessions(&ok(r#"{"implementation": "x"}"#)));
}

#[test]
fn wrong_types_name_field_expectation_and_value() {
    let p = problems(
        r#"{"max_batch_size": "32", "warmup": "yes", "name": 7, "parameters": [1],
            "device_ids": 0, "max_batch_time": "10ms", "cuda": true}"#,
    );
    assert_eq!(
        p,
        [
            "`name` must be a string, got 7",
            "`parameters` must be an object, got [1]",
            "`max_batch_size` must be an integer between 0 and 65536, got \"32\"",
            "`max_batch_time` must be a number of seconds between 0 and 60, got \"10ms\"",
            "`device_ids` must be a non-empty array of GPU indices (integers between 0 and 63), got 0",
            "`warmup` must be true or false, got \"yes\"",
            "`cuda` must be an object, got true",
        ]
    );
}

#[test]
fn integer_ranges_are_named() {
    let p = problems(
        r#"{"max_batch_size": 65537, "max_queue_size": 0, "instances": 65, "intra_op_threads": 0,
            "cuda": {"gpu_mem_limit": 0}}"#,
    );
    assert_eq!(
        p,
        [
            "`max_batch_size` must be an integer between 0 and 65536, got 65537",
            "`max_queue_size` must be an integer between 1 and 1000000, got 0",
            "`instances` must be an integer between 1 and 64, got 65",
            "`intra_op_threads` must be an integer between 1 and 1024 or null, got 0",
            "`cuda.gpu_mem_limit` must be an integer number of bytes, at least 1, got 0",
        ]
    );
    assert_eq!(
        problems(r#"{"instances": 1.5}"#),
        ["`instances` must be an integer between 1 and 64, got 1.5"]
    );
    assert_eq!(
        problems(r#"{"instances": -1}"#),
        ["`instances` must be an integer between 1 and 64, got -1"]
    );
}

#[test]
fn time_ranges_are_named() {
    let p = problems(r#"{"max_batch_time": 60.5, "timeout": 0}"#);
    assert_eq!(
        p,
        [
            "`max_batch_time` must be a number of seconds between 0 and 60, got 60.5",
            "`timeout` must be a number of seconds greater than 0 and at most 86400, got 0",
        ]
    );
    assert_eq!(problems(r#"{"max_batch_time": -0.001}"#).len(), 1);
    assert_eq!(problems(r#"{"timeout": 86400.5}"#).len(), 1);
}

#[test]
fn range_boundaries_are_accepted() {
    let s = ok(
        r#"{"max_batch_size": 65536, "max_batch_time": 60, "max_queue_size": 1000000, "timeout": 86400,
                   "instances": 64, "intra_op_threads": 1024, "device_ids": [63]}"#,
    );
    assert_eq!(s.batching.max_batch_time, Duration::from_secs(60));
    let s = ok(
        r#"{"max_batch_size": 0, "max_batch_time": 0, "max_queue_size": 1, "timeout": 0.001,
                   "instances": 1, "intra_op_threads": 1, "device_ids": [0]}"#,
    );
    assert!(!s.batching.batching_enabled());
    assert_eq!(s.batching.max_batch_time, Duration::ZERO);
}

#[test]
fn device_ids_are_checked_one_by_one() {
    let p = problems(r#"{"device_ids": [0, 64, 0, "1"]}"#);
    assert_eq!(
        p,
        [
            "`device_ids[1]` must be an integer between 0 and 63, got 64",
            "`device_ids` lists device 0 more than once",
            "`device_ids[3]` must be an integer between 0 and 63, got \"1\"",
        ]
    );
    assert_eq!(problems(r#"{"device_ids": []}"#).len(), 1);
}

#[test]
fn enums_accept_names_and_triton_ints() {
    let s = ok(r#"{"cuda": {"arena_extend_strategy": 0, "cudnn_conv_algo_search": 2}}"#);
    assert_eq!(
        s.cuda.arena_extend_strategy,
        Some(ArenaExtendStrategy::NextPowerOfTwo)
    );
    assert_eq!(s.cuda.cudnn_conv_algo_search, Some(CudnnConvAlgoSearch::Default));
    let s = ok(
        r#"{"cuda": {"arena_extend_strategy": "kNextPowerOfTwo", "cudnn_conv_algo_search": "EXHAUSTIVE"}}"#,
    );
    assert_eq!(
        s.cuda.cudnn_conv_algo_search,
        Some(CudnnConvAlgoSearch::Exhaustive)
    );
    let p = problems(
        r#"{"batch_policy": "Fixed", "execution_provider": "gpu",
            "cuda": {"arena_extend_strategy": 2, "cudnn_conv_algo_search": "heuristic"}}"#,
    );
    assert_eq!(
        p,
        [
            "`batch_policy` must be one of \"adaptive\", \"fixed\", got \"Fixed\"",
            "`execution_provider` must be one of \"auto\", \"cpu\", \"cuda\", got \"gpu\"",
            "`cuda.arena_extend_strategy` must be one of \"kNextPowerOfTwo\", \"kSameAsRequested\" (or 0 to 1), got 2",
            "`cuda.cudnn_conv_algo_search` must be one of \"EXHAUSTIVE\", \"HEURISTIC\", \"DEFAULT\" (or 0 to 2), got \"heuristic\"",
        ]
    );
    assert_eq!(
        problems(r#"{"execution_provider": 1}"#).len(),
        1,
        "ints only where Triton uses them"
    );
}

#[test]
fn cuda_options_contradict_cpu_provider() {
    assert_eq!(
        problems(r#"{"execution_provider": "cpu", "cuda": {"do_copy_in_default_stream": false}}"#),
        ["`cuda` options are set but `execution_provider` is \"cpu\"; remove one of them"]
    );
    assert!(parse(r#"{"execution_provider": "cpu", "cuda": {}}"#).is_ok());
    assert!(parse(r#"{"execution_provider": "auto", "cuda": {"gpu_mem_limit": 1}}"#).is_ok());
}

#[test]
fn all_problems_are_collected_and_displayed_joined() {
    let e = parse(r#"{"max_batch_size": -1, "timeout": "x", "warmup": 1, "bogus": 1}"#).unwrap_err();
    assert_eq!(e.problems.len(), 4, "{e}");
    assert_eq!(e.to_string(), e.problems.join("; "));
    assert!(e.problems.iter().all(|p| p.starts_with('`')), "{e}");
}

#[test]
fn invalid_json_reports_line_and_column() {
    let p = problems("{\n  \"max_batch_size\": 32,\n}");
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("invalid JSON: ") && p[0].contains("line 3 column 1"),
        "{p:?}"
    );
    assert_eq!(
        problems("[1, 2]"),
        ["the file must hold a JSON object, got [1,2]"]
    );
    assert_eq!(
        problems(""),
        ["invalid JSON: EOF while parsing a value at line 1 column 0"]
    );
}

#[test]
fn model_names_follow_the_pattern() {
    for good in ["a", "digits", "Res-Net_50.v2", "0", &"x".repeat(128)] {
        assert_eq!(validate_model_name(good), Ok(()), "{good}");
    }
    for bad in ["", "-a", ".hidden", "_x", "a b", "a/b", "é", &"x".repeat(129)] {
        assert!(validate_model_name(bad).is_err(), "{bad}");
    }
    let e = validate_model_name("my model").unwrap_err();
    assert_eq!(
        e,
        "model name \"my model\" does not match `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`: ' ' is not allowed"
    );
    assert_eq!(problems(r#"{"name": "a/b"}"#).len(), 1);
    assert!(problems(r#"{"name": "a/b"}"#)[0].starts_with("`name`: model name \"a/b\""));
}

#[test]
fn invalid_folder_name_needs_an_explicit_name() {
    let defaults = ModelDefaults::default();
    let e = ModelSettings::parse("{}", "my model", &defaults).unwrap_err();
    assert!(
        e.problems[0].starts_with("`name` is not set and the folder name cannot be used: "),
        "{e}"
    );
    let s = ModelSettings::parse(r#"{"name": "my-model"}"#, "my model", &defaults).unwrap();
    assert_eq!(s.name, "my-model");
}

#[test]
fn uri_must_stay_inside_the_folder() {
    let cases = [
        ("C:/model.onnx", "Windows paths are not allowed"),
        ("../other/model.onnx", "`..` is not allowed"),
        ("sub/../../x.onnx", "`..` is not allowed"),
        ("", "it is empty"),
        ("./", "it names no file"),
    ];
    for (uri, why) in cases {
        let p = problems(&format!(r#"{{"parameters": {{"uri": "{uri}"}}}}"#));
        let expected = format!(
            "`parameters.uri` must be a path to a file inside the model folder (or an absolute path inside the repository), got {uri:?} ({why})"
        );
        assert_eq!(p, [expected]);
    }
    assert_eq!(
        ok(r#"{"parameters": {"uri": "./a/./b.onnx"}}"#).uri,
        PathBuf::from("a/b.onnx")
    );
    // Absolute paths parse; the repository scan checks they lead inside the repository.
    assert_eq!(
        ok(r#"{"parameters": {"uri": "/models/m/./model.onnx"}}"#).uri,
        PathBuf::from("/models/m/model.onnx")
    );
    assert_eq!(
        problems(r#"{"parameters": {"uri": 3}}"#),
        ["`parameters.uri` must be a path, got 3"]
    );
}

#[test]
fn version_label_is_checked() {
    assert_eq!(
        ok(r#"{"parameters": {"version": "1.2.3-rc_1"}}"#)
            .version
            .as_deref(),
        Some("1.2.3-rc_1")
    );
    let long = "v".repeat(65);
    for bad in ["", "v 1", long.as_str()] {
        let p = problems(&format!(r#"{{"parameters": {{"version": "{bad}"}}}}"#));
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("`parameters.version` must be 1 to 64 characters of [A-Za-z0-9_.-], got"));
    }
}

#[test]
fn batching_and_version_changes_keep_sessions() {
    let old = ok(r#"{"parameters": {"version": "1"}}"#);
    let new = ok(
        r#"{"parameters": {"version": "2"}, "max_batch_size": 4, "max_batch_time": 0.5,
                     "batch_policy": "fixed", "max_queue_size": 9, "timeout": 1}"#,
    );
    assert!(!old.requires_new_sessions(&new));
    assert!(!old.requires_new_sessions(&old.clone()));
}

#[test]
fn other_changes_need_new_sessions() {
    let old = ok("{}");
    let changes = [
        r#"{"name": "other"}"#,
        r#"{"parameters": {"uri": "other.onnx"}}"#,
        r#"{"instances": 2}"#,
        r#"{"execution_provider": "cpu"}"#,
        r#"{"device_ids": [1]}"#,
        r#"{"intra_op_threads": 2}"#,
        r#"{"warmup": false}"#,
        r#"{"cuda": {"gpu_mem_limit": 1024}}"#,
    ];
    for json in changes {
        assert!(old.requires_new_sessions(&ok(json)), "{json}");
    }
}

#[test]
fn serializes_durations_as_seconds_and_enums_by_name() {
    let s =
        ok(r#"{"max_batch_time": 0.25, "cuda": {"arena_extend_strategy": 1, "cudnn_conv_algo_search": 0}}"#);
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["batching"]["max_batch_time"], 0.25);
    assert_eq!(v["batching"]["timeout"], 60.0);
    assert_eq!(v["batching"]["policy"], "adaptive");
    assert_eq!(v["execution_provider"], "auto");
    assert_eq!(v["uri"], "model.onnx");
    assert_eq!(v["cuda"]["arena_extend_strategy"], "kSameAsRequested");
    assert_eq!(v["cuda"]["cudnn_conv_algo_search"], "EXHAUSTIVE");
    assert_eq!(ExecutionProvider::Cuda.to_string(), "cuda");
    assert_eq!("fixed".parse::<BatchPolicyKind>(), Ok(BatchPolicyKind::Fixed));
    assert!("GPU".parse::<ExecutionProvider>().is_err());
}

mod declared;
mod padding;
mod pipeline;
mod sequence;

#[test]
fn priority_levels_and_their_default() {
    let s = ok(r#"{"priority_levels": 3}"#);
    assert_eq!((s.batching.priority_levels, s.batching.default_priority), (3, 3));
    let s = ok(r#"{"priority_levels": 3, "default_priority": 1}"#);
    assert_eq!(s.batching.default_priority, 1);
    assert_eq!(
        (
            ok("{}").batching.priority_levels,
            ok("{}").batching.default_priority
        ),
        (0, 0)
    );
    assert_eq!(
        problems(r#"{"priority_levels": 3, "default_priority": 4}"#),
        ["`default_priority` must be an integer between 1 and 3, got 4"]
    );
    assert!(problems(r#"{"default_priority": 1}"#)[0].contains("set `priority_levels`"));
}
