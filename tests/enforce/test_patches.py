"""patches/tf_worker_proto.py: fails loudly when TensorFlow stops shipping what we read."""

from tictac_hooks.patches.tf_worker_proto import find_file_descriptor, recv_tensor_request_class


def test_worker_proto_is_embedded_and_recv_tensor_request_has_our_fields():
    fdp = find_file_descriptor()
    assert fdp.package == "tensorflow"
    message = next(m for m in fdp.message_type if m.name == "RecvTensorRequest")
    fields = {f.name: f.number for f in message.field}
    assert fields["step_id"] == 1 and fields["rendezvous_key"] == 2


def test_recv_tensor_request_round_trip_keeps_unknown_fields():
    cls = recv_tensor_request_class()
    raw = cls(step_id=42, rendezvous_key="a;b;c;edge_1_x;0:0").SerializeToString()
    raw += b"\x22\x02\x08\x01"  # field 4 (client_locality), which we do not declare
    m = cls.FromString(raw)
    assert (m.step_id, m.rendezvous_key) == (42, "a;b;c;edge_1_x;0:0")
    assert m.SerializeToString() == raw
