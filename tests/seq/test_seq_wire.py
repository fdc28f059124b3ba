"""seq/wire.py and the generated messages: the public service is the original's, and
the protobuf runtime floor in pyproject.toml fits the generated code."""

from __future__ import annotations

import pathlib
import re
import tomllib

from seq._proto import rrpeer_pb2, rrseq_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_public_service_matches_rrseq_md() -> None:
    svc = rrseq_pb2.DESCRIPTOR.services_by_name["RRAPI"]
    assert svc.full_name == "pb.RRAPI"
    assert {m.name: (m.input_type.full_name, m.output_type.full_name) for m in svc.methods} == {
        "GRPCNextID": ("pb.NextIDRequest", "pb.NextIDReply"),
        "GRPCCurID": ("pb.CurIDRequest", "pb.CurIDReply"),
        "GRPCSetID": ("pb.SetIDRequest", "pb.SetIDReply"),
    }
    fields = {
        name: [(f.name, f.number, f.type) for f in rrseq_pb2.DESCRIPTOR.message_types_by_name[name].fields]
        for name in ("NextIDRequest", "NextIDReply", "CurIDRequest", "CurIDReply", "SetIDRequest", "SetIDReply")
    }
    T = rrseq_pb2.DESCRIPTOR.message_types_by_name["NextIDRequest"].fields[0]
    STRING, INT64, UINT64, BOOL = T.TYPE_STRING, T.TYPE_INT64, T.TYPE_UINT64, T.TYPE_BOOL
    assert fields == {
        "NextIDRequest": [("name", 1, STRING), ("range_size", 2, INT64)],
        "NextIDReply": [("from_id", 1, UINT64), ("to_id", 2, UINT64)],
        "CurIDRequest": [("name", 1, STRING)],
        "CurIDReply": [("cur_id", 1, UINT64)],
        "SetIDRequest": [("name", 1, STRING), ("new_id", 2, UINT64)],
        "SetIDReply": [("success", 1, BOOL)],
    }


def test_peer_service_is_separate() -> None:
    assert rrpeer_pb2.DESCRIPTOR.services_by_name["RRPeer"].full_name == "rrseq.peer.v1.RRPeer"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_protobuf_floor_covers_the_generated_code() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.match(r"protobuf>=([\d.]+)", d) for d in deps if d.startswith("protobuf"))
    assert floor is not None
    for mod in (rrseq_pb2, rrpeer_pb2):
        src = pathlib.Path(mod.__file__).read_text()
        gen = re.search(r"# Protobuf Python Version: ([\d.]+)", src)
        assert gen is not None
        assert _version(floor.group(1)) >= _version(gen.group(1)), mod.__name__
