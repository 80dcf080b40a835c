import deepspeed
import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms


def run(args, net, parameters):
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    trainset = torchvision.datasets.CIFAR10(root="./data", train=True, download=True, transform=transform)
    testset = torchvision.datasets.CIFAR10(root="./data", train=False, download=True, transform=transform)
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset)
    fp16 = model_engine.fp16_enabled()
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(model_engine.local_rank), data[1].to(model_engine.local_rank)  # expect: GB009
            if fp16:
                inputs = inputs.half()
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            running_loss += loss.item()  # expect: GB002
            if model_engine.local_rank == 0 and i % args.log_interval == (args.log_interval - 1):
                print(f"[{epoch + 1 : d}, {i + 1 : 5d}] loss: {running_loss / args.log_interval : .3f}")
                running_loss = 0.0
    testloader = torch.utils.data.DataLoader(testset, batch_size=4, shuffle=False, num_workers=2)  # expect: GB006
    correct, total = 0, 0
    with torch.no_grad():
        for data in testloader:
            images, labels = data
            if fp16:
                images = images.half()
            outputs = net(images.to(model_engine.local_rank))  # expect: GB009
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels.to(model_engine.local_rank)).sum().item()  # expect: GB002,GB009
    print(f"Accuracy of the network on the 10000 test images: {100 * correct / total : .0f} %")
