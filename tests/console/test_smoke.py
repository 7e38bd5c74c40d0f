def test_healthz_reports_database_and_redis(client, db, settings):
    settings.HEALTHZ_TOKEN = "smoke-token"
    assert client.get("/healthz").json() == {"status": "ok"}  # anonymous: status only
    response = client.get("/healthz", HTTP_AUTHORIZATION="Bearer smoke-token")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["components"]["database"]["status"] == "ok"
    assert body["components"]["redis"]["status"] == "ok"
    assert body["components"]["worker"]["status"] == "missing"
