"""A client of ppserve.v1.Ppserve for the network-namespace tests, run inside the coordinator's
namespace with `ip netns exec NS python3 netclient.py ...` (grpcio cannot enter a namespace from
the test process). Messages come from the protos compiled by the tests (--protos DIR).

  netclient.py --protos DIR status ADDR            prints the StatusResponse as one JSON object
  netclient.py --protos DIR generate ADDR REQUEST  REQUEST: a GenerateRequest as JSON; prints one
      line per response {"ids": [...], "t": seconds since start}, then
      {"end": true, "code": "OK"|"UNAVAILABLE"|..., "details": "...", "t": ...}"""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--protos", required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("what", choices=("status", "generate"))
    ap.add_argument("addr")
    ap.add_argument("request", nargs="?")
    a = ap.parse_args()
    sys.path.insert(0, a.protos)
    import grpc
    from google.protobuf import json_format
    from ppserve.v1 import client_pb2 as pb

    ch = grpc.insecure_channel(a.addr, options=[("grpc.enable_http_proxy", 0),
                                                ("grpc.max_receive_message_length", 64 << 20)])
    if a.what == "status":
        call = ch.unary_unary("/ppserve.v1.Ppserve/Status",
                              request_serializer=pb.StatusRequest.SerializeToString,
                              response_deserializer=pb.StatusResponse.FromString)
        try:
            s = call(pb.StatusRequest(), timeout=a.timeout)
        except grpc.RpcError as e:
            print(f"{e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        print(json.dumps(json_format.MessageToDict(s, preserving_proto_field_name=True,
                                                   including_default_value_fields=True)))
        return 0
    req = json_format.Parse(a.request, pb.GenerateRequest())
    call = ch.unary_stream("/ppserve.v1.Ppserve/Generate",
                           request_serializer=pb.GenerateRequest.SerializeToString,
                           response_deserializer=pb.GenerateResponse.FromString)
    t0 = time.monotonic()
    end = {"end": True, "code": "OK", "details": ""}
    try:
        for r in call(req, timeout=a.timeout):
            line = {"ids": list(r.ids), "t": time.monotonic() - t0}
            if r.prompt_ids:
                line["prompt_ids"] = list(r.prompt_ids)
            if r.finish_reason:
                line["finish_reason"] = int(r.finish_reason)
            print(json.dumps(line), flush=True)
    except grpc.RpcError as e:
        end["code"], end["details"] = e.code().name, e.details() or ""
    end["t"] = time.monotonic() - t0
    print(json.dumps(end), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
