tests/compile/passes/distributed/test_fusion_all_reduce_workspace.py: not in the target tag (removed or moved upstream, or added by an earlier patch that is not carried)
