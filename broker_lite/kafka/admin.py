"""The Kafka listener's cluster and admin APIs (docs/kafka.md section 4): DescribeCluster,
DescribeConfigs, CreateTopics, DeleteTopics and CreatePartitions, on llog's topic records
(:mod:`llog.topics`: the same create, delete and alter as ``llog topics``). Topic changes need the
broker's ``write`` role; they run in a thread, never on the event loop."""

from __future__ import annotations

import asyncio
import datetime
import uuid

from kio.schema.errors import ErrorCode

from broker_lite.kafka.server import _build, error_code, serve
from llog.errors import (
    InvalidTopicConfig, InvalidTopicName, LlogError, TopicAlreadyExists, TopicNotFound,
)
from llog.keys import validate_topic
from llog.topics import TOPIC_CONFIGS, TopicSettings, alter_topic, create_topic, delete_topic

#: DescribeConfigs' resource types.
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
#: DescribeConfigs' config sources: a topic's own setting, or the default.
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
_NO_OPERATIONS = -2147483648
_ZERO = datetime.timedelta(0)


def _admin_error(e: BaseException) -> ErrorCode:
    if isinstance(e, TopicAlreadyExists):
        return ErrorCode.topic_already_exists
    if isinstance(e, InvalidTopicName):
        return ErrorCode.invalid_topic_exception
    if isinstance(e, InvalidTopicConfig):
        return ErrorCode.invalid_config
    if isinstance(e, (ValueError, TypeError)):
        return ErrorCode.invalid_request
    return error_code(e)


@serve(60, "describe_cluster", "DescribeClusterRequest", 0, 1)
async def describe_cluster(listener, request, response_class):
    brokers = tuple(_build(response_class, "DescribeClusterBroker", broker_id=node, host=host, port=port, rack=None)
                    for node, host, port in listener.known_brokers())
    return _build(response_class, response_class.__name__, throttle_time=_ZERO, error_code=ErrorCode.none,
                  error_message=None, endpoint_type=1, cluster_id=listener.cluster_id,
                  controller_id=listener.registry.node_id, brokers=brokers,
                  cluster_authorized_operations=_NO_OPERATIONS)


@serve(32, "describe_configs", "DescribeConfigsRequest", 1, 4)
async def describe_configs(listener, request, response_class):
    results = await asyncio.to_thread(_describe_configs, listener, request, response_class)
    return _build(response_class, response_class.__name__, throttle_time=_ZERO, results=tuple(results))


def _describe_configs(listener, request, response_class) -> list:
    results = []
    for resource in request.resources:
        wanted = set(resource.configuration_keys) if resource.configuration_keys is not None else None
        configs, code, message = [], ErrorCode.none, None
        try:
            if resource.resource_type == TOPIC_RESOURCE:
                validate_topic(resource.resource_name)
                record = listener.app.reader.topics.get(resource.resource_name, fresh=True)
                if record is None:
                    raise TopicNotFound(resource.resource_name)
                settings = TopicSettings.of(record.topic, record, listener.app.config).as_kafka()
                own = record.config or {}
                for name in TOPIC_CONFIGS:
                    if wanted is None or name in wanted:
                        configs.append(_config(response_class, name, settings[name],
                                               DYNAMIC_TOPIC_CONFIG if name in own else DEFAULT_CONFIG))
            elif resource.resource_type != BROKER_RESOURCE:  # a broker has no settings a client can read
                code, message = ErrorCode.invalid_request, f"resource type {resource.resource_type} is not served"
        except LlogError as e:
            code, message = _admin_error(e), str(e)
        results.append(_build(response_class, "DescribeConfigsResult", error_code=code, error_message=message,
                              resource_type=resource.resource_type, resource_name=resource.resource_name,
                              configs=tuple(configs)))
    return results


def _config(response_class, name: str, value, source: int):
    return _build(response_class, "DescribeConfigsResourceResult", name=name, value=str(value), read_only=False,
                  is_default=source == DEFAULT_CONFIG, config_source=source, is_sensitive=False, synonyms=(),
                  config_type=0, documentation=None)


@serve(19, "create_topics", "CreateTopicsRequest", 2, 7)
async def create_topics(listener, request, response_class):
    results = await asyncio.to_thread(_create_topics, listener, request, response_class)
    return _build(response_class, response_class.__name__, throttle_time=_ZERO, topics=tuple(results))


def _create_topics(listener, request, response_class) -> list:
    results = []
    config = listener.app.config
    for topic in request.topics:
        count, topic_id, code, message = topic.num_partitions, None, ErrorCode.none, None
        try:
            if listener.app.writer is None:
                raise _role_error()
            if count == -1:  # the broker's default (KIP-464)
                count = config.default_partitions
            settings = {c.name: c.value for c in topic.configs}
            if topic.assignments:
                raise ValueError("replica assignments are not served: llog has no replicas to place")
            if request.validate_only:
                validate_topic(topic.name)
                if listener.app.reader.topics.get(topic.name, fresh=True) is not None:
                    raise TopicAlreadyExists(topic.name)
            else:
                record = create_topic(listener.app.writer.coordination, config.root_prefix, topic.name, count,
                                      settings=settings)
                topic_id = record.topic_id
        except (LlogError, ValueError, TypeError) as e:
            code, message = _admin_error(e), str(e)
        results.append(_build(response_class, "CreatableTopicResult", name=topic.name,
                              topic_id=uuid.UUID(topic_id) if topic_id else uuid.UUID(int=0), error_code=code,
                              error_message=message, topic_config_error_code=ErrorCode.none,
                              num_partitions=count if code == ErrorCode.none else -1,
                              replication_factor=1 if code == ErrorCode.none else -1, configs=()))
    return results


@serve(20, "delete_topics", "DeleteTopicsRequest", 1, 6)
async def delete_topics(listener, request, response_class):
    results = await asyncio.to_thread(_delete_topics, listener, request, response_class)
    return _build(response_class, response_class.__name__, throttle_time=_ZERO, responses=tuple(results))


def _delete_topics(listener, request, response_class) -> list:
    names = list(request.topic_names) if hasattr(request, "topic_names") else [t.name for t in request.topics]
    results = []
    app = listener.app
    for name in names:
        code, message = ErrorCode.none, None
        try:
            if app.writer is None:
                raise _role_error()
            if name is None:
                raise ValueError("topics are deleted by name: topic ids are not served here")
            if app.reader.topics.get(name, fresh=True) is None:
                raise TopicNotFound(name)
            delete_topic(app.writer.coordination, app.writer.objects, app.config.root_prefix, name, config=app.config)
        except (LlogError, ValueError) as e:
            code, message = _admin_error(e), str(e)
        results.append(_build(response_class, "DeletableTopicResult", name=name, topic_id=uuid.UUID(int=0),
                              error_code=code, error_message=message))
    return results


@serve(37, "create_partitions", "CreatePartitionsRequest", 0, 3)
async def create_partitions(listener, request, response_class):
    results = await asyncio.to_thread(_create_partitions, listener, request, response_class)
    return _build(response_class, response_class.__name__, throttle_time=_ZERO, results=tuple(results))


def _create_partitions(listener, request, response_class) -> list:
    results = []
    app = listener.app
    for topic in request.topics:
        code, message = ErrorCode.none, None
        try:
            if app.writer is None:
                raise _role_error()
            if topic.assignments:
                raise ValueError("replica assignments are not served: llog has no replicas to place")
            record = app.reader.topics.get(topic.name, fresh=True)
            if record is None:
                raise TopicNotFound(topic.name)
            if topic.count <= record.partitions:  # Kafka's rule: partitions are only added
                code = ErrorCode.invalid_partitions
                message = f"topic {topic.name!r} has {record.partitions} partitions; a new count must be more"
            elif not request.validate_only:
                alter_topic(app.writer.coordination, app.config.root_prefix, topic.name, partitions=topic.count)
        except (LlogError, ValueError) as e:
            code, message = _admin_error(e), str(e)
        results.append(_build(response_class, "CreatePartitionsTopicResult", name=topic.name, error_code=code,
                              error_message=message))
    return results


def _role_error() -> LlogError:
    from broker_lite.kafka.server import _NotServed

    return _NotServed("this broker's role does not write: topics are changed on a write broker")
