"""The TOML config file: values, inheritance (behaviour §5.13), and located error messages."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from kestrel_actors.config import (
    INT_MAX,
    LONG_MAX,
    QUEUE_SETTINGS,
    SERVER_SETTINGS,
    ConfigError,
    QueueConfig,
    ServerConfig,
    effective_queue_config,
    load_config,
    parse_config,
    resolve_queue_configs,
)
from kestrel_actors.config import _values as values
from kestrel_actors.config._toml_lines import KeyLines, format_key

from ..helpers import REPO

MIB = 1024 * 1024


def parse(text: str) -> ServerConfig:
    return parse_config(textwrap.dedent(text), "k.toml")


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return [str(problem) for problem in info.value.problems]


# -- coverage of the config classes ---------------------------------------------------------


def test_every_queue_field_has_a_parser():
    assert {f.name for f in dataclasses.fields(QueueConfig)} == set(QUEUE_SETTINGS)


def test_every_server_field_has_a_parser():
    tables = {"queue_defaults", "queues", "aliases", "zookeeper"}
    assert {f.name for f in dataclasses.fields(ServerConfig)} - tables == set(SERVER_SETTINGS)

DOCS = REPO / "docs" / "configuration.md"


def test_docs_mention_every_setting():
    docs = DOCS.read_text()
    for name in [*QUEUE_SETTINGS, *SERVER_SETTINGS]:
        assert f"`{name}`" in docs, name


# -- whole files ----------------------------------------------------------------------------


def test_empty_file_gives_the_defaults():
    config = parse("")
    assert isinstance(config, ServerConfig)
    assert config == ServerConfig()
    assert config.queue_defaults == QueueConfig()
    assert config.default_status == "Up" and config.status_file is None


def test_server_settings():
    config = parse("""
        host = "0.0.0.0"
        port = 22133
        text_port = 2222
        data_dir = "/var/spool/kestrel"
        max_open_transactions = 100
        max_item_bytes = "16MiB"
        max_line_bytes = 1024
        monitor_max_items = 50
        expiration_timer_frequency = "1s"
        client_timeout = "30s"
        max_connections = 10
        connection_limit_refuse_writes = 8
        connection_limit_refuse_reads = "none"
        status_file = "/tmp/st"
        default_status = "quiescent"
        status_change_grace_period = "30s"
    """)
    assert (config.host, config.port, config.text_port) == ("0.0.0.0", 22133, 2222)
    assert config.data_dir == "/var/spool/kestrel"
    assert config.max_open_transactions == 100
    assert config.max_item_bytes == 16 * MIB and config.max_line_bytes == 1024
    assert config.monitor_max_items == 50
    assert config.expiration_timer_frequency == 1.0 and config.client_timeout == 30.0
    assert config.max_connections == 10
    assert config.connection_limit_refuse_writes == 8 and config.connection_limit_refuse_reads is None
    assert config.status_file == "/tmp/st" and config.default_status == "Quiescent"
    assert config.status_change_grace_period == 30.0


def test_admin_address_and_token():
    """Issue 21.4: the admin port's own address, and the token its acting endpoints require;
    the token is kept out of repr and out of error messages."""
    config = parse("""
        admin_host = "127.0.0.2"
        admin_token = "s3cret-from-the-file"
    """)
    assert (config.admin_host, config.admin_token) == ("127.0.0.2", "s3cret-from-the-file")
    assert "s3cret" not in repr(config)
    assert (ServerConfig().admin_host, ServerConfig().admin_token) == ("127.0.0.1", None)
    assert problems("""
        admin_token = "two words"
        admin_host = ""
    """) == [
        "k.toml:2: admin_token: expected 1 to 256 visible ASCII characters, no spaces; got a string of 9 characters",
        "k.toml:3: admin_host: expected a non-empty string; got ''",
    ]


@pytest.mark.parametrize("value, kind", [
    ('{ value = "s3cret-in-a-table" }', "a table"),
    ('["s3cret-in-an-array"]', "an array"),
    ("31337", "an integer"),
    ("true", "a boolean"),
    ("1979-05-27T07:32:00Z", "a date or time"),
])
def test_a_token_of_another_type_is_never_echoed(value, kind):
    """Issue 53.5: a table or an array was echoed by repr (and a number as it was)."""
    [message] = problems(f"admin_token = {value}\n")
    assert message.endswith(f"visible ASCII characters, no spaces; got {kind}"), message
    assert "s3cret" not in message and "31337" not in message and "1979" not in message


def test_timers_can_be_turned_off():
    config = parse('expiration_timer_frequency = 0\nclient_timeout = "none"\n')
    assert config.expiration_timer_frequency is None and config.client_timeout is None


def test_shipped_development_queues():
    config = parse("""
        [queue_defaults]
        default_journal_size = "16MB"
        max_memory_size = "128MB"
        max_journal_size = "1GB"

        [queues.weather_updates]
        max_age = 1800
        max_items = 1_500_000

        [queues.transient_events]
        keep_journal = false

        [queues.jobs_pending]
        expire_to_queue = "jobs_ready"
        max_age = "30s"

        [queues.jobs_ready]
        sync_journal = 0

        [queues.hello]
        fanout_only = true

        [queues.small]
        max_size = "128MB"
        max_memory_size = "16MB"
        max_journal_size = "128MB"
        discard_old_when_full = true

        [queues.slow]
        sync_journal = "10ms"

        [aliases]
        wx_updates = ["weather_updates"]
        spam_all = ["spam", "spam0"]
    """)
    q = config.queue_config
    assert q("weather_updates").max_age == 1800.0 and q("weather_updates").max_items == 1_500_000
    assert q("transient_events").keep_journal is False
    assert q("jobs_pending").expire_to_queue == "jobs_ready" and q("jobs_pending").max_age == 30.0
    assert q("jobs_ready").sync_journal == 0.0
    assert q("hello").fanout_only is True
    assert q("small") == QueueConfig(max_size=128 * MIB, max_memory_size=16 * MIB,
                                     max_journal_size=128 * MIB, discard_old_when_full=True)
    assert q("slow").sync_journal == pytest.approx(0.01)
    assert q("anything_else") == QueueConfig()
    assert config.aliases == {"wx_updates": ("weather_updates",), "spam_all": ("spam", "spam0")}


# -- inheritance ----------------------------------------------------------------------------


INHERIT = """
    [queue_defaults]
    max_items = 100
    sync_journal = "100ms"

    [queues.master]
    max_items = 10
    max_age = "1m"
    fanout_only = true

    [queues."master+configured"]
    max_age = "5s"

    [queues."orphan+child"]
    keep_journal = false
"""


def test_defaults_apply_to_every_queue():
    config = parse(INHERIT)
    assert config.queue_config("other") == QueueConfig(max_items=100, sync_journal=0.1)


def test_master_overrides_only_what_it_sets():
    master = parse(INHERIT).queue_config("master")
    assert master == QueueConfig(max_items=10, sync_journal=0.1, max_age=60.0, fanout_only=True)


def test_unconfigured_child_uses_the_masters_resolved_config():
    config = parse(INHERIT)
    assert config.queue_config("master+new") == config.queue_config("master")
    # including fanout_only, which has no effect on a child
    assert config.queue_config("master+new").fanout_only is True
    # the split is at the first "+"
    assert config.queue_config("master+a+b") == config.queue_config("master")


def test_configured_child_overrides_the_master():
    child = parse(INHERIT).queue_config("master+configured")
    assert child == QueueConfig(max_items=10, sync_journal=0.1, max_age=5.0, fanout_only=True)


def test_configured_child_of_unconfigured_master_starts_from_the_defaults():
    config = parse(INHERIT)
    assert config.queue_config("orphan+child") == QueueConfig(max_items=100, sync_journal=0.1, keep_journal=False)
    assert config.queue_config("orphan") == QueueConfig(max_items=100, sync_journal=0.1)
    assert config.queue_config("orphan+other") == QueueConfig(max_items=100, sync_journal=0.1)


def test_a_child_can_clear_an_inherited_optional_setting():
    config = parse("""
        [queues.m]
        expire_to_queue = "dead"
        max_age = "1m"
        [queues."m+c"]
        expire_to_queue = ""
        max_age = "none"
    """)
    assert config.queue_config("m+c").expire_to_queue is None
    assert config.queue_config("m+c").max_age is None


def test_effective_queue_config_and_resolve_are_pure():
    defaults = QueueConfig(max_items=7)
    resolved = resolve_queue_configs(defaults, {"a": {"max_age": 1.0}, "a+b": {"max_items": 3}, "z+y": {}})
    assert resolved == {
        "a": QueueConfig(max_items=7, max_age=1.0),
        "a+b": QueueConfig(max_items=3, max_age=1.0),
        "z+y": QueueConfig(max_items=7),
    }
    config = ServerConfig(queue_defaults=defaults, queues=resolved)
    assert effective_queue_config(config, "a+new") == resolved["a"]
    assert effective_queue_config(config, "nope") == defaults


# -- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [(0, 0.0), (30, 30.0), (1.5, 1.5), ("100ms", 0.1), ("30s", 30.0), ("1m", 60.0),
     ("2h", 7200.0), ("1d", 86400.0), ("1.5s", 1.5), (" 10 MS ", 0.01), ("200us", 0.0002),
     ("50µs", 0.00005)],
)
def test_durations(raw, seconds):
    assert values.duration(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", [-1, "1", "1 fortnight", "s", True, "-5s", [1]])
def test_bad_durations(raw):
    with pytest.raises(values.BadValue):
        values.duration(raw)


@pytest.mark.parametrize(
    ("raw", "result"),
    [("never", None), ("Always", 0.0), (0, 0.0), ("10ms", 0.01), (2, 2.0)],
)
def test_sync_journal(raw, result):
    parsed = values.sync_journal(raw)
    if result is None:
        assert parsed is None
    else:
        assert parsed == pytest.approx(result)


@pytest.mark.parametrize(
    ("raw", "size"),
    [(0, 0), (512, 512), ("512", 512), ("1K", 1024), ("16MiB", 16 * MIB), ("128MB", 128 * MIB),
     ("1gb", 1024 * MIB), ("1.5KiB", 1536), ("2 TB", 2 << 40), ("7B", 7)],
)
def test_sizes(raw, size):
    assert values.size(raw) == size


@pytest.mark.parametrize("raw", [-1, "big", "1XB", 1.5, True, "1e6"])
def test_bad_sizes(raw):
    with pytest.raises(values.BadValue):
        values.size(raw)


def test_unlimited_limits():
    config = parse('[queue_defaults]\nmax_items = "unlimited"\nmax_size = "unlimited"\n')
    assert config.queue_defaults.max_items == INT_MAX and config.queue_defaults.max_size == LONG_MAX


# -- errors, with file, line and key ---------------------------------------------------------


def test_unknown_keys_name_the_line():
    assert problems("""
        port = 1
        maxItems = 3
        [queue_defaults]
        # a comment
        max_itemz = 4
        [queues."jobs+a"]
        max_age = "1m"
        fanout = true
        [bogus]
    """) == [
        ("k.toml:3: maxItems: unknown server setting: max_items is a queue setting; "
         'put it in [queue_defaults] or [queues."name"]'),
        "k.toml:6: queue_defaults.max_itemz: unknown queue setting (did you mean max_items?)",
        'k.toml:9: queues."jobs+a".fanout: unknown queue setting (did you mean fanout_only?)',
        "k.toml:10: bogus: unknown server setting",
    ]


def test_bad_values_name_the_line():
    assert problems("""
        port = 70000
        default_status = "down"
        [queues.a]
        sync_journal = "sometimes"
        keep_journal = "yes"
        [queues."b"]
        max_items = -1
    """) == [
        "k.toml:2: port: expected an integer between 0 and 65535; got 70000",
        'k.toml:3: default_status: expected one of "Up", "ReadOnly", "WriteAvoid", "Quiescent"; got \'down\'',
        ('k.toml:5: queues.a.sync_journal: expected "never", "always" or a duration: seconds as a number, '
         'or a string like "100ms", "30s", "5m", "1h"; got \'sometimes\''),
        "k.toml:6: queues.a.keep_journal: expected true or false; got 'yes'",
        "k.toml:8: queues.b.max_items: expected an integer between 0 and 2147483647; got -1",
    ]


def test_kestrel_names_get_a_hint():
    [problem] = problems('queuePath = "/x"\n')
    assert problem == "k.toml:1: queuePath: unknown server setting (did you mean data_dir?)"
    [problem] = problems("[default]\nmax_items = 1\n")
    assert problem == "k.toml:1: default: unknown server setting (did you mean queue_defaults?)"


def test_unsupported_kestrel_settings():
    [problem] = problems('[queues.a]\nwhiteListClientIdForDequeue = ["x"]\n')
    assert problem.startswith("k.toml:2: queues.a.whiteListClientIdForDequeue: not supported")


def test_server_setting_in_a_queue_table():
    [problem] = problems("[queues.a]\nport = 1\n")
    assert problem == ("k.toml:2: queues.a.port: unknown queue setting: port is a server setting; "
                       "put it at the top of the file")


def test_illegal_queue_and_alias_names():
    assert problems("""
        [queues."a.b"]
        max_items = 1
        [queues."x~y"]
        [queues.ok]
        expire_to_queue = "bad/name"
        [aliases]
        "al.ias" = ["q"]
        empty = []
        dest = ["fine", "not.fine"]
        notalist = "q"
    """) == [
        "k.toml:2: queues.\"a.b\": queue name 'a.b' contains illegal characters (one of: ~ . /)",
        "k.toml:4: queues.\"x~y\": queue name 'x~y' contains illegal characters (one of: ~ . /)",
        "k.toml:6: queues.ok.expire_to_queue: queue name 'bad/name' contains illegal characters (one of: ~ . /)",
        "k.toml:8: aliases.\"al.ias\": queue name 'al.ias' contains illegal characters (one of: ~ . /)",
        "k.toml:9: aliases.empty: expected a non-empty list of destination queue names; got []",
        "k.toml:10: aliases.dest: queue name 'not.fine' contains illegal characters (one of: ~ . /)",
        "k.toml:11: aliases.notalist: expected a non-empty list of destination queue names; got 'q'",
    ]


def test_tables_of_the_wrong_shape():
    assert problems("""
        queue_defaults = 3
        [queues]
        a = 5
    """) == [
        "k.toml:2: queue_defaults: expected a table (queue settings); got 3",
        "k.toml:4: queues.a: expected a table (queue settings); got 5",
    ]


def test_dotted_and_inline_keys_are_located():
    assert problems("""
        queues.a.max_items = "x"
        [queues.b]
        opts = { max_age = "1m" }
    """) == [
        "k.toml:2: queues.a.max_items: expected an integer; got 'x'",
        "k.toml:4: queues.b.opts: unknown queue setting",
    ]


def test_invalid_toml_names_the_line():
    [problem] = problems("port = 1\nhost = \n")
    assert problem.startswith("k.toml:2: invalid TOML: ")


def test_load_config_reads_a_file(tmp_path):
    path = tmp_path / "kestrel.toml"
    path.write_text('port = 1234\n[queues.q]\nmax_items = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:3: queues.q.max_items: expected an integer; got 'x'"
    path.write_text("port = 1234\n")
    assert load_config(path).port == 1234


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "nope.toml")


def test_the_example_in_the_docs_loads():
    docs = DOCS.read_text()
    example = docs.split("## Example", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    config = parse_config(example, "docs")
    assert config.queue_config("jobs_pending").expire_to_queue == "jobs_ready"


# -- the key locator ------------------------------------------------------------------------


def test_key_lines():
    lines = KeyLines(textwrap.dedent('''\
        a = 1
        s = """
        x = 2
        """
        [t."q+r"]
        'lit' = 3
        "esc\\"aped" = 4
        [[arr]]
        k = 5
    '''))
    assert lines.line_of(("a",)) == 1
    assert lines.line_of(("x",)) is None
    assert lines.line_of(("t", "q+r")) == 5
    assert lines.line_of(("t", "q+r", "lit")) == 6
    assert lines.line_of(("t", "q+r", 'esc"aped')) == 7
    assert lines.line_of(("t", "q+r", "unknown")) == 5
    assert lines.line_of(("arr", "k")) == 9
    assert format_key(("queues", "a+b", "max_items")) == 'queues."a+b".max_items'
