"""Where data rests on disk: LMDB prioritized replay, tasksets and checkpoints.

Roles call into this package; it holds no role logic. The replay store keeps experience groups
in LMDB with idempotent writes and transactional use counts; datafiles finds and reads
jsonl/json/parquet/arrow files or Hugging Face dataset folders, and tasksets hands their rows
out as tasks with a resumable cursor; checkpoints are written in the Hugging Face layout that
Trinity-RFT users already know.
"""
