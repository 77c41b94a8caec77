"""The test harness itself: isolation fixtures and real worker processes."""
import redis
import psycopg


def test_redis_databases_are_leased_per_test(redis_url):
    client = redis.Redis.from_url(redis_url)
    assert not redis_url.endswith("/0"), "tests must never use database 0 (it holds the leases)"
    assert client.dbsize() == 0


def test_postgres_database_is_fresh(pg_dsn):
    with psycopg.connect(pg_dsn) as conn:
        tables = conn.execute("select count(*) from pg_tables where schemaname = 'public'").fetchone()[0]
    assert tables == 0


def test_a_real_worker_runs_a_task_on_each_broker(broker_url, unique_name, worker_factory):
    env = {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": unique_name}
    worker = worker_factory("apps.plain", queues=[unique_name], env=env, concurrency=1)
    from celery import Celery

    producer = Celery(broker=broker_url)
    producer.send_task("plain.add", args=(2, 3), queue=unique_name)
    worker.wait_for_log("succeeded", timeout=30)
    assert "plain.add" in worker.log()
    producer.close()
