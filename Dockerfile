FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt ./
COPY contracts ./contracts
COPY services ./services
RUN pip install --no-cache-dir -c constraints.txt .
EXPOSE 8080
ENTRYPOINT ["tollgate", "serve", "--host", "0.0.0.0", "--port", "8080"]
CMD ["--target", "all"]
