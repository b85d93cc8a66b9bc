"""Helpers shared by the test suite, imported one way: `from tests.helpers.<module> import ...`.

- chains.py: span executor chains in-process (the parity runner's open and forward).
- factories.py: test data built in one place (`peer_span`: a peer's announced span).
- lab.py: peers and clients inside the network lab's sites (sim/netlab.py).
- markers.py: the cost markers (quick, model, peers, slow) and the rule that puts them on every test.
- mtp_oracle.py: the whole-model MTP draft-head reference (csrc/mtp_oracle.cpp, test-only library).
- oracle.py: llama.cpp's whole-model references (completion text; prompt and step logits), cached per session.
- peers.py: peer processes and their `serve` arguments, raw span streams, polling with a deadline.
- synthetic.py: tiny synthetic GGUF models of every architecture swarm.arch has a row for; split GGUFs.
"""
