"""The ``[zookeeper]`` block, ``serve``'s ZooKeeper flags, and the server-set member format
(no ZooKeeper needed here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kestrel_actors.cluster import Endpoint, ServerSetAddress, ServiceInstance, decode_member, encode_member
from kestrel_actors.config import ConfigError, ZooKeeperConfig, ZooKeeperCredentials, parse_config


def test_the_zookeeper_block_with_kestrel_defaults():
    config = parse_config('[zookeeper]\nhost = "zk1"\npath_prefix = "/kestrel/prod"\n', "k.toml")
    assert config.zookeeper == ZooKeeperConfig(host="zk1", path_prefix="/kestrel/prod", port=2181,
                                               session_timeout=10.0, credentials=None, acl="open")
    assert parse_config("", "k.toml").zookeeper is None


def test_every_key_of_the_zookeeper_block():
    config = parse_config(
        '[zookeeper]\nhost = "10.0.0.5"\nport = 2182\npath_prefix = "/k"\nsession_timeout = "4s"\n'
        'credentials = { user = "kestrel", password = "pw" }\nacl = "creator-all"\n', "k.toml")
    assert config.zookeeper == ZooKeeperConfig(
        host="10.0.0.5", port=2182, path_prefix="/k", session_timeout=4.0,
        credentials=ZooKeeperCredentials("kestrel", "pw"), acl="creator-all")
    assert "pw" not in repr(config.zookeeper)


@pytest.mark.parametrize(("text", "message"), [
    ('[zookeeper]\npath_prefix = "/k"\n', "zookeeper: host is required"),
    ('[zookeeper]\nhost = "zk"\n', "zookeeper: path_prefix is required"),
    ('[zookeeper]\nhost = "zk"\npath_prefix = "kestrel"\n', "zookeeper.path_prefix: expected an absolute"),
    ('[zookeeper]\nhost = "zk"\npathPrefix = "/k"\n', "unknown zookeeper setting (did you mean path_prefix?)"),
    ('[zookeeper]\nhost = "zk"\npath_prefix = "/k"\nacl = "creator-all"\n', "needs credentials"),
    ('[zookeeper]\nhost = "zk"\npath_prefix = "/k"\nacl = "closed"\n', 'expected "open" or "creator-all"'),
    ('[zookeeper]\nhost = "zk"\npath_prefix = "/k"\nsession_timeout = 0\n', "above 0"),
    ('[zookeeper]\nhost = "zk"\npath_prefix = "/k"\ncredentials = "u:p"\n', "expected a table"),
    ('zookeeper = "zk:2181"\n', "expected a table"),
])
def test_a_bad_zookeeper_block_is_refused_with_its_line(text, message):
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "k.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("k.toml:")


@pytest.mark.parametrize(("flags", "error"), [
    (["--zookeeper", "127.0.0.1:1"], "--zookeeper-path-prefix"),
    (["--zookeeper", "127.0.0.1:1", "--zookeeper-path-prefix", "/k", "--zookeeper-acl", "creator-all"],
     "needs --zookeeper-credentials"),
    (["--zookeeper", "127.0.0.1:1", "--zookeeper-path-prefix", "k/"], "expected an absolute"),
])
def test_serve_refuses_incomplete_zookeeper_flags(tmp_path, flags, error):
    result = subprocess.run([sys.executable, "-m", "kestrel_actors.cli", "serve", "--port", "0",
                             "--data-dir", str(tmp_path), *flags], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert error in result.stderr


def test_a_member_is_twitter_service_instance_json():
    main = Endpoint("10.0.0.1", 22133)
    instance = ServiceInstance(main, {"memcache": main, "thrift": Endpoint("10.0.0.1", 2229)}, "ALIVE")
    data = encode_member(instance)
    assert json.loads(data) == {
        "serviceEndpoint": {"host": "10.0.0.1", "port": 22133},
        "additionalEndpoints": {"memcache": {"host": "10.0.0.1", "port": 22133},
                                "thrift": {"host": "10.0.0.1", "port": 2229}},
        "status": "ALIVE",
    }
    assert decode_member(data) == instance
    assert decode_member(encode_member(instance.with_status("DEAD"))).status == "DEAD"
    # finagle/commons members this client may meet: a shard, no additional endpoints
    assert decode_member(b'{"serviceEndpoint":{"host":"h","port":1},"status":"ALIVE","shard":3}').shard == 3
    for bad in (b"", b"[]", b'{"status":"ALIVE"}', b'{"serviceEndpoint":{"host":"h","port":1}}',
                b'{"serviceEndpoint":{"host":"h"},"status":"ALIVE"}',
                b'{"serviceEndpoint":{"host":"h","port":1},"status":"UP"}'):
        with pytest.raises(ValueError):
            decode_member(bad)


def test_server_set_addresses():
    assert ServerSetAddress.parse("zk://zk1:2181,zk2/kestrel/write") == ServerSetAddress(
        "zk1:2181,zk2:2181", "/kestrel/write")
    assert str(ServerSetAddress.parse("zk://[::1]/k/read")) == "zk://[::1]:2181/k/read"
    for bad in ("zk://", "zk://h", "zk:///k", "zk://h/k/", "h:2181/k"):
        with pytest.raises(ValueError):
            ServerSetAddress.parse(bad)
