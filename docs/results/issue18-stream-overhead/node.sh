cd ${SRC:-/work/wt-api}
M=$(PYTHONPATH=/work/wt-api /work/main/.venv/bin/python -c "from p2pinfer.engines.model_files import default_model_path as d; print(d())")
exec env PYTHONPATH=${SRC:-/work/wt-api} /work/main/.venv/bin/python -m p2pinfer node --engine llama-cpp --listen /ip4/127.0.0.1/tcp/0 --http-host 127.0.0.1 --http-port ${PORT:-18777} --key-file /tmp/sp/node${PORT:-18777}.key --quiet --log-level WARNING --model $M --threads 2 --context 4096 --slots 8 ${EXTRA}
