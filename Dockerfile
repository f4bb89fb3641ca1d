# syntax=docker/dockerfile:1
# TideMQ container image.
#
#   docker build -t tidemq .                      # name server, broker and operator (default target)
#   docker build --target spark -t tidemq-spark . # an official Apache Spark image with tidemq added
#   docker run tidemq namesrv | broker ... | operator ...   (the entrypoint is `tidemq`)
#
# Layers: the dependencies (read from pyproject.toml) are installed before the source is copied,
# so editing the code rebuilds only the last small layers. The CRDs (crds/) are copied next to the
# operator package, where tidemq.operator.crds looks for them.
#
# The hot paths are compiled (Cython extensions, setup.py): only the builder stage has a C
# compiler; the wheel it builds carries the extensions, and the build fails unless
# `tidemq --version` reports them all compiled (a silent fallback to the pure-Python twins would
# ship an image that spends more CPU per message: docs/benchmarks.md, issue 19).

ARG PYTHON_IMAGE=python:3.11-slim
ARG SPARK_IMAGE=apache/spark:4.0.0-python3

# ---- builder: a virtual environment with the dependencies, then tidemq itself ----------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# 0. the C compiler for the compiled extensions (this stage only: the runtime image has none)
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && python -m venv /opt/tidemq
WORKDIR /src
# 1. dependencies only (this layer changes only when pyproject.toml does)
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['operator']))" > /tmp/requirements.txt \
 && /opt/tidemq/bin/pip install -r /tmp/requirements.txt
# 2. the source tree (setup.py builds every .pyx of it into an extension module)
COPY README.md setup.py ./
COPY tidemq/ tidemq/
COPY services/ services/
COPY operator/ operator/
COPY spark/ spark/
COPY crds/ crds/
# the wheel is built once (Cython and setuptools come in pip's build isolation) and installed
RUN /opt/tidemq/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/tidemq/bin/pip install --no-deps /wheels/*.whl \
 && cp -r crds "$(/opt/tidemq/bin/python -c 'import pathlib, tidemq.operator as o; print(pathlib.Path(o.__file__).parent)')/crds" \
 && /opt/tidemq/bin/tidemq --help > /dev/null \
 && /opt/tidemq/bin/tidemq --version > /tmp/version.txt \
 && cat /tmp/version.txt \
 && grep -q "hot paths: compiled extensions" /tmp/version.txt

# ---- spark: the official Apache Spark image with tidemq (and its PySpark connector) added -----
# The Spark image's own Python may be older than tidemq needs (3.11+): tidemq gets its own
# Python 3.11 virtual environment and PySpark is pointed at it.
FROM ${SPARK_IMAGE} AS spark
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="tidemq-spark" \
      org.opencontainers.image.description="Apache Spark with the TideMQ client and PySpark connector" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/tidemq/tidemq"
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/tidemq
COPY --from=builder /wheels /tmp/wheels
# pyarrow and pandas: the 'spark' extra without pyspark (the image's own Spark provides it)
RUN /opt/tidemq/bin/pip install --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl \
      "pyarrow>=15" "pandas>=2.0,<3" \
 && rm -rf /tmp/wheels
# the example jobs (spark/jobs; the SparkApplications in spark/manifests run them from here) and
# the Prometheus JMX exporter agent that SparkApplication spec.monitoring.prometheus loads
ARG JMX_EXPORTER_VERSION=1.1.0
COPY spark/jobs/ /opt/tidemq/jobs/
ADD --chmod=644 https://repo1.maven.org/maven2/io/prometheus/jmx/jmx_prometheus_javaagent/${JMX_EXPORTER_VERSION}/jmx_prometheus_javaagent-${JMX_EXPORTER_VERSION}.jar /opt/tidemq/prometheus/jmx_prometheus_javaagent.jar
COPY crds/ /tmp/crds/
RUN cp -r /tmp/crds "$(/opt/tidemq/bin/python -c 'import pathlib, tidemq.operator as o; print(pathlib.Path(o.__file__).parent)')/crds" \
 && rm -rf /tmp/crds
ENV PATH=/opt/tidemq/bin:$PATH \
    PYSPARK_PYTHON=/opt/tidemq/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/tidemq/bin/python
USER spark

# ---- runtime (last stage = the default target): slim Python, non-root, `tidemq` entrypoint ---
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="tidemq" \
      org.opencontainers.image.description="A message queue speaking Apache RocketMQ's wire protocol: name server, broker and Kubernetes operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/tidemq/tidemq" \
      org.opencontainers.image.url="https://github.com/tidemq/tidemq" \
      org.opencontainers.image.vendor="TideMQ"
RUN groupadd --system --gid 10001 tidemq \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tidemq --no-create-home \
      --shell /usr/sbin/nologin tidemq \
 && mkdir -p /var/lib/tidemq /etc/tidemq \
 && chown 10001:10001 /var/lib/tidemq
COPY --from=builder /opt/tidemq /opt/tidemq
ENV PATH=/opt/tidemq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/tidemq
VOLUME ["/var/lib/tidemq"]
# name server, broker (remoting); metrics ports are set per component with --metrics-listen
EXPOSE 9876 10911
USER 10001:10001
ENTRYPOINT ["tidemq"]
CMD ["--help"]
