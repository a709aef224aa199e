"""Print DualPipe's F&B pair of two chunks on the two streams (training/pipeline/ep_overlap.py
`dualpipe_pair_seconds`; the pieces of tests/test_ep_overlap_pair.py), with and without a
quarter of the SMs taken by each communication kernel.

    python benchmarks/dualpipe_pair.py
"""

from simsp.training.pipeline.ep_overlap import LayerPieces, dualpipe_pair_seconds, issued_timeline

F = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)  # seconds
B = LayerPieces(pre_dispatch=5.0, dispatch=2.0, mlp=6.0, combine=2.0, mlp_dw=3.0,
                pre_dispatch_dw=2.0)


def main() -> None:
    """Two layers a chunk, PP sends of 1 s: each setting's spans, end, hidden and exposed
    communication seconds."""
    issued = dualpipe_pair_seconds([F] * 2, [B] * 2, 1.0, 1.0)
    for sm_count, comm_sms in ((None, 0), (4, 1)):
        t = issued_timeline(issued, sm_count, comm_sms)
        print(f"SMs {sm_count or 'not shared'}, each communication kernel {comm_sms}: end "
              f"{t.end_s:g} s, communication hidden {t.comm_hidden_s:g} s, exposed "
              f"{t.comm_exposed_s:g} s")
        for who, piece, stream, start, end in t.spans:
            print(f"  {stream:8s} {who}.{piece:16s} {start:6g} .. {end:6g}")


if __name__ == "__main__":
    main()
