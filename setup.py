from setuptools import find_packages, setup

setup(
    name="llog",
    version="0.1.0",
    description="A Spark-first leaderless log (diskless Kafka): record bytes in S3, offsets and index in Oxia.",
    python_requires=">=3.11,<3.12",
    # compaction_job too: its Spark tasks import it on the executors (databricks.yml installs this wheel).
    packages=find_packages(include=["llog", "llog.*", "llog_tools", "llog_tools.*", "llog_sink", "llog_sink.*",
                                    "llog_source", "llog_source.*", "pyspark_llog", "compaction_job", "broker_lite"]),
    # No pyspark here: a cluster (Databricks, any Spark >= 4.0) keeps its own; `llog[spark]` brings
    # the versions this project is tested with (`make` installs it).
    install_requires=[
        "pandas<3",
        "pyarrow",
        "numpy",
        "boto3",
        "tenacity",
        # Progress bars of `llog compact`, `llog gc`, the demo and `python -m bench` (off when not a TTY).
        "rich>=13",
        # CRC-32 of batch bodies (the same checksum as zlib.crc32, an order of magnitude faster).
        "isal",
        # Oxia's wire messages (llog/oxia_client_pb2.py, from `make proto`): the C protobuf
        # runtime encodes and decodes them 20x faster than the oxia client's pure-Python one.
        "protobuf>=7.35.1,<8",
        # oxia 0.2.1 fails to import, or raises TypeError on every keyed call, without these.
        "oxia==0.2.1",
        "betterproto2==0.9.1",
        "betterproto2-compiler==0.9.0",
        "xxhash<4",
        # The HTTP broker (broker_lite): a bare ASGI app on uvicorn with uvloop and httptools,
        # bodies decoded and encoded by msgspec.
        "uvicorn==0.54.0",
        "uvloop>=0.21",
        "httptools>=0.6",
        # The broker's Kafka listener (docs/kafka.md): kio's types, generated from Kafka's own
        # message schemas (every API version, flexible versions), read by its Rust extension;
        # aiokafka's Cython record-batch codec (CRC-32C, varints) with cramjam for the
        # compression codecs Kafka clients send (gzip, snappy, lz4, zstd).
        "kio==0.6.5",
        "aiokafka==0.14.0",
        "cramjam==2.14.0",
        "msgspec==0.22.0",
        # The broker's GET /metrics/prometheus (broker_lite/metrics.py, its own registry).
        "prometheus_client==0.26.0",
    ],
    extras_require={
        # Spark and Delta for the connectors and jobs where the machine has none (a laptop, CI).
        "spark": ["pyspark==4.2.0", "delta-spark==4.4.1"],
        # A Spark Connect client (`SparkSession.builder.remote("sc://...")`, docs/spark-connect.md):
        # what pyspark.sql.connect checks for at import beyond llog's own pandas, pyarrow and
        # numpy, at the versions of pyspark 4.2's own [connect] extra (a client on a pip
        # pyspark without that extra fails on the first missing one, grpcio-status first).
        "connect": ["grpcio>=1.76.0", "grpcio-status>=1.76.0", "googleapis-common-protos>=1.71.0", "zstandard>=0.25.0"],
        # The data-quality gate of jobs/llog_to_delta.py (--expectations); plain, as its [spark]
        # extra pins an older pyspark.
        "quality": ["great-expectations==1.24.1"],
        # The test tools (pytest-xdist: `make test` on several workers; pyyaml: the databricks.yml test; httpx:
        # the broker's tests; schemathesis: fuzzing the broker against its OpenAPI document, which
        # openapi-spec-validator checks).
        "dev": ["pytest", "pytest-xdist==3.8.0", "chispa", "hypothesis", "grpcio-tools", "pyyaml", "httpx==0.28.1",
                # Real Kafka clients against the Kafka listener: librdkafka's, and a pure-Python one.
                "confluent-kafka==2.16.1", "kafka-python==3.0.12",
                "schemathesis==4.32.5", "openapi-spec-validator==0.9.0",
                # The notebooks (executed headless by the tests), the demo's report, and the
                # wheel built by the packaging test.
                "nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0", "matplotlib==3.11.2", "build==1.6.1",
                # The documentation site from docs/ (mkdocs.yml; `make docs`, tests/unit/test_docs_site.py).
                "mkdocs==1.6.1", "mkdocs-material==9.8.2", "pymdown-extensions==13.1.2",
                # Where make test's CPU goes, by process (tests/cpu_census.py).
                "psutil==7.2.2"],
    },
    # The S3 price table `llog topics describe` estimates costs with (llog_tools/pricing.py finds it
    # in <prefix>/share/llog when installed, in conf/ in a checkout).
    data_files=[("share/llog", ["conf/s3_prices.json", "conf/llog.example.toml"])],
    entry_points={"console_scripts": ["llog=llog_tools.cli:main"]},
)
