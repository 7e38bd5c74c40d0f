def test_healthz_reports_database_and_redis(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["components"]["database"]["status"] == "ok"
    assert body["components"]["redis"]["status"] == "ok"
    assert body["components"]["worker"]["status"] == "missing"
